"""Preflight: before torch.distributed connects the workers, check they can.

Every worker reports its host, node address, GPUs, network interfaces and the interface that routes to
rank 0. raytrain then
- checks a named ``--interface`` exists (with an IPv4 address, up) on every worker,
- otherwise, on a multi-node job, has each worker use the interface through which it reaches rank 0 (the
  usual fix for process groups that hang on docker0/virbr0/lo or an unroutable hostname, ray#45825),
- sets ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` on the workers (unless the job's env sets them),
- has rank 0 listen on its address and every worker connect to it (from the chosen interface),
and fails within seconds, naming the node, instead of hanging for the process-group timeout.

``decide`` is pure (unit-tested); the probes run inside the Ray Train workers (``describe``, ``listen``,
``connect``), driven from Ray Train's controller by ``PreflightTorchConfig``'s backend.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 60.0  # how long the controller waits for every worker's probe result


class PreflightError(RuntimeError):
    """The workers cannot form a process group; the message names the worker, node and what to change."""


# -- worker-side probes ---------------------------------------------------------------------------------
def source_address(dest: str) -> str | None:
    """The local IPv4 address the kernel would use to reach ``dest`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((dest, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def allocator() -> str:
    """The malloc this process runs with: "jemalloc" where a libjemalloc is mapped (preloaded: raytrain's CPU
    workers on its own nodes, raytrain.ray_tuning.ray_setup_worker), else "default" (the C library's)."""
    try:
        with open("/proc/self/maps") as f:
            return "jemalloc" if "libjemalloc" in f.read() else "default"
    except OSError:
        return "default"


def describe(master_addr: str) -> dict[str, Any]:
    """This worker: host, node address, GPUs, IPv4 interfaces, the address that routes to rank 0, its malloc."""
    import psutil
    import ray

    interfaces = {
        name: [a.address for a in addrs if a.family == socket.AF_INET]
        for name, addrs in psutil.net_if_addrs().items()
    }
    up = {name: bool(st.isup) for name, st in psutil.net_if_stats().items()}
    # outside a Ray worker there are no Ray GPU ids: ray.get_gpu_ids() would auto-start a local Ray instance
    gpus = [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
    return {
        "host": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "gpus": gpus,
        "interfaces": interfaces,
        "up": up,
        "route_source": source_address(master_addr),
        "env": {k: os.environ[k] for k in IFNAME_VARS if os.environ.get(k)},
        "allocator": allocator(),
    }


def listen(addr: str, seconds: float) -> int:
    """Accept (and drop) TCP connections on ``addr`` for ``seconds`` in a background thread; the port."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, 0))
    server.listen(128)
    server.settimeout(0.5)
    deadline = time.monotonic() + seconds

    def serve():
        with server:
            while time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                    conn.close()
                except socket.timeout:
                    continue
                except OSError:
                    return

    threading.Thread(target=serve, name="raytrain-preflight", daemon=True).start()
    return server.getsockname()[1]


def connect(addr: str, port: int, source_ip: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None if a TCP connection to addr:port (from ``source_ip``) works, else the error."""
    try:
        with socket.create_connection((addr, port), timeout=timeout,
                                      source_address=(source_ip, 0) if source_ip else None):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def set_env(env: dict[str, str]) -> None:
    os.environ.update(env)


# -- the decision (pure) --------------------------------------------------------------------------------
@dataclass
class Decision:
    interface: dict[int, str] = field(default_factory=dict)  # rank -> interface to use ({} = leave as is)
    reason: str = ""
    problems: list[str] = field(default_factory=list)

    def source_ip(self, rank: int, report: dict[str, Any]) -> str | None:
        name = self.interface.get(rank)
        addrs = report["interfaces"].get(name) if name else None
        return addrs[0] if addrs else None


def _where(rank: int, report: dict[str, Any]) -> str:
    return f"rank {rank} on {report['host']} ({report['node_ip']})"


def _by_node(reports: list[dict[str, Any]]) -> list[tuple[list[int], dict[str, Any]]]:
    """The workers grouped by node: ([ranks], one report of that node), in rank order."""
    nodes: dict[str, tuple[list[int], dict[str, Any]]] = {}
    for rank, r in enumerate(reports):
        nodes.setdefault(r["node_ip"], ([], r))[0].append(rank)
    return list(nodes.values())


def _node(ranks: list[int], report: dict[str, Any]) -> str:
    which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return f"node {report['host']} ({report['node_ip']}, {which})"


def route_interface(report: dict[str, Any]) -> str | None:
    """The interface that owns the address this worker uses to reach rank 0."""
    src = report.get("route_source")
    for name, addrs in report["interfaces"].items():
        if src and src in addrs:
            return name
    return None


def decide(reports: list[dict[str, Any]], interface: str | None, gpus_per_worker: float = 0) -> Decision:
    """Which interface each worker uses, and what makes the job impossible."""
    decision = Decision()
    if gpus_per_worker > 0:
        for rank, r in enumerate(reports):
            if not r.get("gpus"):
                decision.problems.append(
                    f"{_where(rank, r)} was given no GPU although the job asks for {gpus_per_worker:g} per worker "
                    "(check the node's GPU resources: `raytrain gpus`)"
                )
    if interface:
        for ranks, r in _by_node(reports):
            names = sorted(n for n, a in r["interfaces"].items() if a)
            where = _node(ranks, r)
            if interface not in r["interfaces"]:
                decision.problems.append(
                    f"--interface {interface}: {where} has no interface {interface!r} "
                    f"(its IPv4 interfaces: {', '.join(names) or 'none'})"
                )
            elif not r["interfaces"][interface]:
                decision.problems.append(f"--interface {interface}: on {where} it has no IPv4 address")
            elif not r["up"].get(interface, True):
                decision.problems.append(f"--interface {interface}: on {where} it is down")
        if not decision.problems:
            decision.interface = {rank: interface for rank in range(len(reports))}
            decision.reason = "--interface"
        return decision
    if decision.problems:
        return decision
    if any(r.get("env") for r in reports):
        decision.reason = "set by the job's environment"
        return decision
    if len({r["node_ip"] for r in reports}) < 2:
        decision.reason = "single node"
        return decision
    routes = [route_interface(r) for r in reports]
    if None in routes:
        unknown = ", ".join(str(i) for i, name in enumerate(routes) if name is None)
        decision.reason = f"no interface owns the route to rank 0 on rank(s) {unknown}; left to gloo/NCCL"
        return decision
    # Each process names the interface that reaches rank 0 on its own node (the variables are per process),
    # so nodes whose interfaces are named differently (eth0 / ens5) work too.
    decision.interface = dict(enumerate(routes))
    if len(set(routes)) == 1:
        decision.reason = "the interface every worker routes to rank 0 through"
    else:
        decision.reason = "each worker's route to rank 0"
    return decision


# -- the Ray Train backend ------------------------------------------------------------------------------
def unanswered(refs: list, not_ready: list) -> list[int]:
    """The ranks (positions in ``refs``) whose result is among ``not_ready``."""
    late = set(not_ready)
    return [rank for rank, ref in enumerate(refs) if ref in late]


def no_answer_error(what: str, ranks: list[int], timeout_s: float) -> PreflightError:
    return PreflightError(
        f"preflight: worker rank(s) {', '.join(map(str, ranks))} did not answer ({what}) within {timeout_s:g} s: "
        "the worker process is stuck or its node is overloaded or unreachable"
    )


def gather(refs: list, what: str, timeout_s: float = ANSWER_TIMEOUT_S) -> list:
    """``ray.get(refs)`` bounded: a PreflightError naming the ranks that did not answer in time."""
    import ray

    _, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if not_ready:
        raise no_answer_error(what, unanswered(refs, not_ready), timeout_s)
    return ray.get(refs)


def run(worker_group: Any, interface: str | None) -> dict[str, Any]:
    """Probe the started worker group; set the interface variables; raise PreflightError naming problems."""
    from raytrain.ray_tuning.ray_access import address_and_port as get_address_and_port

    started = time.monotonic()
    master_addr, _ = gather([worker_group.execute_single_async(0, get_address_and_port)], "its address")[0]
    reports = gather(worker_group.execute_async(describe, master_addr), "describing itself")
    gpus = float(worker_group.get_resources_per_worker().get("GPU", 0) or 0)
    decision = decide(reports, interface, gpus)
    if decision.problems:
        raise PreflightError("preflight: " + "; ".join(decision.problems))
    port = gather([worker_group.execute_single_async(0, listen, master_addr, CONNECT_TIMEOUT_S * 3)],
                  "listening for the others")[0]
    failures = []
    refs = [
        worker_group.execute_single_async(rank, connect, master_addr, port, decision.source_ip(rank, r))
        for rank, r in enumerate(reports)
    ]
    for rank, (r, error) in enumerate(zip(reports, gather(refs, "connecting to rank 0"))):
        if error:
            via = f" via {decision.interface[rank]}" if rank in decision.interface else ""
            failures.append(f"{_where(rank, r)} cannot reach rank 0 at {master_addr}:{port}{via} ({error})")
    if failures:
        hint = "" if interface else " (name the interface that connects the nodes with --interface)"
        raise PreflightError("preflight: " + "; ".join(failures) + hint)
    gather([
        worker_group.execute_single_async(rank, set_env, {k: name for k in IFNAME_VARS})
        for rank, name in decision.interface.items()
    ], "setting the network interface")
    return {
        "master": master_addr,
        "interface": decision.interface.get(0),
        "reason": decision.reason,
        "workers": [
            {"rank": i, "host": r["host"], "ip": r["node_ip"], "gpus": r["gpus"],
             "interface": decision.interface.get(i) or route_interface(r), "allocator": r.get("allocator")}
            for i, r in enumerate(reports)
        ],
        "seconds": round(time.monotonic() - started, 2),
    }


def before_process_group(worker_group: Any, interface: str | None) -> None:
    """What both backends' ``on_start`` (here and raytrain.ray_tuning.lazy_torch) do, on Ray Train's controller,
    before the process group forms: record there too (the preflight and restarts in the run's record), mark
    the workers started, run the preflight and write its summary."""
    from raytrain import events, run_record, timings

    run_record.start_from_env("controller")
    timings.emit("workers_started")
    from raytrain.runtime.worker import preemption

    # SIGTERM becomes a preemption notice; a handler can only be set on a process's main thread, where the
    # worker actor's tasks run (its train function runs on a thread of its own)
    worker_group.execute(preemption.install)
    events.emit(events.PREFLIGHT, **run(worker_group, interface))
    timings.emit("preflight")


def torch_config(*, timeout_s: float, interface: str | None) -> Any:
    """A TorchConfig whose backend runs the preflight before setting up the process group."""
    from ray.train.torch import TorchConfig

    from raytrain import timings

    ray_backend = TorchConfig().backend_cls  # Ray's torch backend, through TorchConfig's public property

    class _PreflightBackend(ray_backend):
        def on_start(self, worker_group, backend_config):
            before_process_group(worker_group, backend_config.interface)
            super().on_start(worker_group, backend_config)
            timings.emit("process_group")

    @dataclass
    class PreflightTorchConfig(TorchConfig):
        interface: str | None = None

        @property
        def backend_cls(self):
            return _PreflightBackend

    return PreflightTorchConfig(timeout_s=int(timeout_s), interface=interface)
