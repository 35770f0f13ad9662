"""`cluster up` tries Ray's head once more when `ray start` gave up on its raylet within Ray's fixed 30 s (a
loaded machine), or Ray Client's server did and Ray stopped the node with it, and refuses with the reason when
that happens again. It returns only once that server listens, so a head that is about to stop is never
handed to a submit."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain.clusters import local_head, ports, ray_process
from raytrain.errors import ClusterError
from tests.conftest import free_port


def test_the_words_raytrain_looks_for_are_those_of_the_installed_ray():
    node_py = Path(importlib.util.find_spec("ray").submodule_search_locations[0]) / "_private" / "node.py"
    source = node_py.read_text()
    assert local_head.RAYLET_LATE in source and "raylet_start_wait_time_s = 30" in source


def test_the_client_servers_words_and_its_fixed_wait_are_those_of_the_installed_ray():
    ray_dir = Path(importlib.util.find_spec("ray").submodule_search_locations[0])
    services = (ray_dir / "_private" / "services.py").read_text()
    assert local_head.CLIENT_SERVER_LATE in services and "timeout_s: float = 30," in services
    assert "get_node_with_retry(address, node_id)" in (ray_dir / "util" / "client" / "server" / "proxier.py").read_text()


# A stand-in for `ray start --head --block` whose dashboard answers with one node. On its first start its Ray
# Client server gives up on the raylet 2 s later and it stops, printing what Ray prints then; on the second its
# client server listens. (The real race needs a loaded machine.)
FAKE_HEAD = r"""
import http.server, json, socket, sys, threading, time
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
first = sys.argv[1] == "first"
answers = {"/api/version": {"ray_version": "2.60.0"}, "/api/jobs/": [],
           "/nodes?view=summary": {"data": {"summary": [{"raylet": {"nodeId": "n1", "state": "ALIVE"}}]}}}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(answers.get(self.path, {})).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(args["dashboard-port"])), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
if first:
    time.sleep(2)
    print("Some Ray subprocesses exited unexpectedly:\n  ray_client_server [exit code=1]\n"
          "RuntimeError: Timed out waiting for node info for node_id=265f5c3c.", flush=True)
    sys.exit(1)
client = socket.socket(); client.bind(("127.0.0.1", int(args["ray-client-server-port"]))); client.listen()
time.sleep(120)
"""


def test_a_head_whose_client_server_gave_up_is_started_once_more_and_returned_once_it_listens(
        raytrain_home, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")  # stock Ray: the head starts Ray Client's server
    spawned = []

    def fake_head(args, *, token_path, log_path, extra_env=None):
        spawned.append(args)
        with open(log_path, "ab") as log:
            return subprocess.Popen([sys.executable, "-c", FAKE_HEAD, "first" if len(spawned) == 1 else "again",
                                     *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    monkeypatch.setattr(ray_process, "spawn", fake_head)
    port = free_port()
    dashboard = free_port(avoid={port})
    client = local_head._ports_of(local_head._head_command(port, dashboard, tmp_path))["--ray-client-server-port"]
    cluster, started = local_head.up(port=port, dashboard_port=dashboard, timeout_s=100)
    try:
        assert started and len(spawned) == 2  # the first one's dashboard had answered: it was not taken
        err = capsys.readouterr().err
        assert err.count("starting it once more") == 1 and "Ray Client's server gave up on the raylet" in err, err
        assert ports.listening(client)
        assert local_head.current() is not None and local_head.current().pid == cluster.pid
    finally:
        ray_process.terminate(cluster.pid)


def test_with_the_tunings_on_ray_2_60s_head_starts_no_client_server_and_none_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    monkeypatch.setattr("raytrain.ray_tuning.ray_version", lambda: "2.60.0")
    assert local_head._client_port(local_head._head_command(20001, 38265, tmp_path)) is None
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert local_head._client_port(local_head._head_command(20001, 38265, tmp_path)) == 20002
    assert local_head._client_port(local_head._head_command(6379, 8265, tmp_path)) == 10001


def test_a_late_raylet_is_tried_once_more_then_refused_with_its_reason(raytrain_home, monkeypatch, capsys):
    # Ray's raylet late past Ray's 30 s needs a loaded machine: stand-ins for `ray start` exit with its words
    spawned = []

    def late_ray_start(args, *, token_path, log_path, extra_env=None):
        spawned.append(args)
        with open(log_path, "wb") as log:
            return subprocess.Popen([sys.executable, "-c", "import sys; print('Exception: The current node timed out "
                                     "during startup. This could happen because some of the raylet failed to startup "
                                     "or the GCS has become overloaded.'); sys.exit(1)"], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    monkeypatch.setattr(ray_process, "spawn", late_ray_start)
    port = free_port()
    dashboard = free_port(avoid={port})
    with pytest.raises(ClusterError) as err:
        local_head.up(port=port, dashboard_port=dashboard, timeout_s=100)
    assert len(spawned) == 2
    assert "Ray's raylet did not register within Ray's fixed 30 s" in str(err.value)
    assert "(tried 2 time(s) within 100 s)" in str(err.value)
    assert capsys.readouterr().err.count("starting it once more") == 1
    assert local_head.current() is None  # nothing recorded as running

    spawned.clear()  # not when what is left of the bound is shorter than Ray's own wait
    with pytest.raises(ClusterError, match=r"tried 1 time\(s\) within 20 s"):
        local_head.up(port=port, dashboard_port=dashboard, timeout_s=20)
    assert len(spawned) == 1


def test_the_ports_derived_from_the_dashboards_never_equal_a_port_given(tmp_path):
    # CI drew --port 53129 and --dashboard-port 59029: the agent's derived port was 53129 too, and Ray refused
    ports = local_head._ports_of(local_head._head_command(53129, 59029, tmp_path))
    assert ports["--port"] == 53129 and ports["--dashboard-port"] == 59029
    assert len(set(ports.values())) == 4 and ports["--dashboard-agent-listen-port"] == 53130, ports
    ports = local_head._ports_of(local_head._head_command(20001, 38265, tmp_path))
    assert ports["--ray-client-server-port"] == 20002 and len(set(ports.values())) == 4, ports
