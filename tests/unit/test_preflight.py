"""Preflight: the interface decision (pure) and the real TCP probes on loopback."""
import os
import socket

from raytrain.cli.progress import describe_preflight, describe_resize
from raytrain.runtime.driver.preflight import connect, decide, describe, listen, route_interface, source_address


def report(host, ip, interfaces, route_source, env=None, up=None):
    return {
        "host": host, "node_ip": ip, "gpus": [], "interfaces": interfaces,
        "up": up or {n: True for n in interfaces}, "route_source": route_source, "env": env or {},
    }


HEAD = report("head", "10.1.0.1", {"lo": ["127.0.0.1"], "eth1": ["10.1.0.1"], "docker0": ["172.17.0.1"]}, "10.1.0.1")
NODE2 = report("node2", "10.1.0.2", {"lo": ["127.0.0.1"], "eth1": ["10.1.0.2"]}, "10.1.0.2")


def test_named_interface_missing_on_a_node_is_named():
    d = decide([HEAD, NODE2], "docker0")
    assert d.interface == {}
    assert len(d.problems) == 1
    msg = d.problems[0]
    assert "--interface docker0" in msg and "node node2 (10.1.0.2, rank 1)" in msg and "eth1" in msg
    both = decide([NODE2, NODE2], "docker0").problems
    assert len(both) == 1 and "ranks 0,1" in both[0]


def test_named_interface_down_or_without_ipv4_is_a_problem():
    down = report("n", "10.1.0.3", {"eth1": ["10.1.0.3"]}, "10.1.0.3", up={"eth1": False})
    assert "is down" in decide([down], "eth1").problems[0]
    bare = report("n", "10.1.0.3", {"eth1": []}, "10.1.0.3")
    assert "no IPv4" in decide([bare], "eth1").problems[0]


def test_named_interface_present_everywhere_is_used_on_every_worker():
    d = decide([HEAD, NODE2, NODE2], "eth1")
    assert d.problems == [] and d.interface == {0: "eth1", 1: "eth1", 2: "eth1"}
    assert d.source_ip(1, NODE2) == "10.1.0.2" and d.source_ip(0, HEAD) == "10.1.0.1"


def test_common_route_is_chosen_on_multi_node_jobs_only():
    d = decide([HEAD, NODE2], None)
    assert d.interface == {0: "eth1", 1: "eth1"} and "routes to rank 0" in d.reason
    assert route_interface(HEAD) == "eth1"
    single = decide([HEAD, HEAD], None)
    assert single.interface == {} and single.reason == "single node"


def test_differently_named_routes_are_set_per_worker_unknown_ones_left_alone():
    other = report("node3", "10.2.0.3", {"ens5": ["10.2.0.3"]}, "10.2.0.3")
    d = decide([HEAD, other], None)
    assert d.interface == {0: "eth1", 1: "ens5"} and d.reason == "each worker's route to rank 0"
    lost = report("node4", "10.2.0.4", {"ens5": ["10.2.0.4"]}, None)
    d = decide([HEAD, lost], None)
    assert d.interface == {} and "rank(s) 1" in d.reason


def test_user_env_leaves_the_choice_alone():
    mine = report("node2", "10.1.0.2", {"eth1": ["10.1.0.2"]}, "10.1.0.2", env={"GLOO_SOCKET_IFNAME": "eth1"})
    d = decide([HEAD, mine], None)
    assert d.interface == {} and "environment" in d.reason


def test_probes_connect_on_loopback_and_fail_fast_on_a_closed_port():
    port = listen("127.0.0.1", 5)
    assert connect("127.0.0.1", port, None) is None
    assert connect("127.0.0.1", port, "127.0.0.1") is None
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    error = connect("127.0.0.1", closed, None, timeout=2)
    assert error and "refused" in error.lower()
    assert source_address("127.0.0.1") == "127.0.0.1"


def test_describe_reports_this_machine():
    import ray

    r = describe("127.0.0.1")
    assert r["host"] == socket.gethostname() and "lo" in r["interfaces"]
    assert r["route_source"] == "127.0.0.1" and route_interface(r) == "lo"
    assert r["gpus"] == [] and not ray.is_initialized()  # outside a worker: no Ray instance started for GPU ids
    assert r["allocator"] == ("jemalloc" if "jemalloc" in os.environ.get("LD_PRELOAD", "") else "default")


def test_terminal_lines():
    event = {"master": "10.1.0.1", "interface": "eth1", "reason": "the interface every worker routes to rank 0 through",
             "seconds": 0.4, "workers": [
                 {"rank": 0, "host": "head", "ip": "10.1.0.1", "gpus": ["0"], "interface": "eth1"},
                 {"rank": 1, "host": "node2", "ip": "10.1.0.2", "gpus": ["0"], "interface": "eth1"}]}
    lines = describe_preflight(event)
    assert "2 worker(s) on 2 node(s)" in lines[0] and "GLOO/NCCL_SOCKET_IFNAME=eth1" in lines[0]
    assert any("node2 (10.1.0.2): rank(s) 1, 1 GPU(s), via eth1" in line for line in lines)
    assert "malloc" not in lines[0]  # an older runtime's event names none
    event["workers"][0]["allocator"] = event["workers"][1]["allocator"] = "jemalloc"
    assert describe_preflight(event)[0].endswith("; malloc: jemalloc")
    event["workers"][1]["allocator"] = "default"
    assert describe_preflight(event)[0].endswith("; malloc: jemalloc on rank(s) 0, default on rank(s) 1")
    resize = describe_resize({"workers": 1, "range": "1-2", "grad_accum": 8, "planned_grad_accum": 4,
                              "planned_workers": 2, "train_batch": 32})
    assert "1 worker(s)" in resize and "grad-accum 8 (planned 4 on 2)" in resize and "global batch 32" in resize


def test_a_gpu_job_whose_worker_got_no_gpu_is_refused_naming_it():
    with_gpu = {**NODE2, "gpus": ["0"]}
    d = decide([with_gpu, HEAD], None, gpus_per_worker=1)
    assert len(d.problems) == 1 and "rank 1 on head (10.1.0.1) was given no GPU" in d.problems[0]
    assert decide([with_gpu], None, gpus_per_worker=1).problems == []


def test_a_worker_that_does_not_answer_is_named_instead_of_waited_for():
    from raytrain.runtime.driver.preflight import ANSWER_TIMEOUT_S, PreflightError, no_answer_error, unanswered

    refs = ["ref0", "ref1", "ref2"]
    assert unanswered(refs, ["ref2", "ref1"]) == [1, 2]
    err = no_answer_error("connecting to rank 0", [1, 2], ANSWER_TIMEOUT_S)
    assert isinstance(err, PreflightError)
    assert str(err).startswith("preflight: worker rank(s) 1, 2 did not answer (connecting to rank 0) within 60 s")
