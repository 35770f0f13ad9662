"""Two real Ray nodes on this machine, talking over a real network: the ``two_nodes`` fixture.

Layout (all real: `ip netns`, a veth pair, `ray start` through raytrain's CLI, no mocks)::

    root network namespace                      netns rt-node2 (+ a private mount namespace)
    head: raytrain cluster up                   node 2: raytrain cluster join 10.213.0.1:PORT
          --node-ip 10.213.0.1                          --node-ip 10.213.0.2
          --resources {"node_head": 1}                  --resources {"node_2": 1}
          --num-cpus 1                                  --num-cpus 1
    veth rt-mn0 10.213.0.1/24  <--------------------->  veth rt-mn1 10.213.0.2/24 (and lo up)

Node 2 runs in its own network namespace (its processes are listed by ``ip netns pids rt-node2``) and in a
private mount namespace where ``node_local_dir`` is a fresh tmpfs: a file the head writes there is not seen
by node 2's tasks and vice versa (node-local disk). ``shared_dir`` is the same folder on both (shared disk).

Needs root (skips with the reason otherwise, or when ``ip netns add`` fails). Ports: the head's GCS on
``RAYTRAIN_TEST_MN_PORT``, dashboard on 127.0.0.1:``RAYTRAIN_TEST_MN_DASHBOARD_PORT``, each picked free at
the start of the run when not given. Both nodes' RAYTRAIN_HOMEs (and the netns) go to $RAYTRAIN_TEST_RECORDS. Everything it made is removed at the end, whatever happened. Startup takes
about 30-40 s on 2 cores (head ~15 s, node 2 ~10 s).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import free_port, needs, record_cluster
from tests.e2e.conftest import CLI

NETNS = os.environ.get("RAYTRAIN_TEST_MN_NETNS", "rt-node2")
VETH_ROOT, VETH_NODE2 = "rt-mn0", "rt-mn1"
HEAD_IP, NODE2_IP = "10.213.0.1", "10.213.0.2"
PREFIX = 24

# Run inside the netns: a private mount namespace with a fresh tmpfs on $1, then exec the rest.
_NODE2_SHELL = 'mount -t tmpfs -o size=64m,mode=1777 rt-mn-local "$1" && shift && exec "$@"'


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def netns_pids(netns: str = NETNS) -> list[int]:
    """Every process in the network namespace (``ip netns pids``); [] if the netns is gone."""
    proc = _sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def kill_netns(netns: str = NETNS, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in the netns until none is left (a raylet's children may appear late)."""
    deadline = time.monotonic() + timeout_s
    while (pids := netns_pids(netns)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _teardown_network() -> None:
    kill_netns()
    _sh("ip", "netns", "del", NETNS, check=False)
    _sh("ip", "link", "del", VETH_ROOT, check=False)


def _setup_network() -> None:
    _teardown_network()  # leftovers of a run that was killed
    _sh("ip", "netns", "add", NETNS)
    _sh("ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NODE2)
    _sh("ip", "link", "set", VETH_NODE2, "netns", NETNS)
    _sh("ip", "addr", "add", f"{HEAD_IP}/{PREFIX}", "dev", VETH_ROOT)
    _sh("ip", "link", "set", VETH_ROOT, "up")
    _sh("ip", "netns", "exec", NETNS, "ip", "addr", "add", f"{NODE2_IP}/{PREFIX}", "dev", VETH_NODE2)
    _sh("ip", "netns", "exec", NETNS, "ip", "link", "set", VETH_NODE2, "up")
    _sh("ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up")


def _env(home: Path, temp_dir: Path, port: str, dashboard_port: str) -> dict[str, str]:
    env = {
        **os.environ,
        "RAYTRAIN_HOME": str(home),
        "RAYTRAIN_RAY_TEMP_DIR": str(temp_dir),
        "RAYTRAIN_PORT": port,
        "RAYTRAIN_DASHBOARD_PORT": dashboard_port,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }
    for key in ("RAYTRAIN_ADDRESS", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        env.pop(key, None)
    return env


@dataclass
class TwoNodes:
    """What ``two_nodes`` yields. All attributes are plain values; the methods act on the real cluster.

    cli             CLI (as in tests/e2e) with RAYTRAIN_HOME = the head's: ``cli("submit", ...)`` runs on the head.
    node2_cli       CLI with node 2's RAYTRAIN_HOME (run in the root namespaces; `cluster down` works from there).
    head_ip, node2_ip   10.213.0.1, 10.213.0.2.
    gcs_address     the head's GCS, "10.213.0.1:PORT".
    token_path      the head's auth token (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH=it for ray.init clients).
    node_local_dir  a path that is a different folder on each node (a tmpfs on node 2).
    shared_dir      a folder both nodes see (e.g. Ray Train storage for checkpoints).
    netns           the network namespace of node 2 ("rt-node2").
    startup_s       how long the whole setup took.
    """

    cli: CLI
    node2_cli: CLI
    head_ip: str
    node2_ip: str
    gcs_address: str
    token_path: Path
    node_local_dir: Path
    shared_dir: Path
    netns: str
    startup_s: float = 0.0
    _start_node2: Callable[[], None] = field(default=None, repr=False)

    def node2_pids(self) -> list[int]:
        return netns_pids(self.netns)

    def node2_alive(self) -> bool:
        """True while any process of node 2 runs (``ip netns pids`` is not empty)."""
        return bool(self.node2_pids())

    def kill_node2(self) -> None:
        """SIGKILL every process of node 2: the node is lost as if its machine died (no graceful stop).
        The head notices after Ray's health-check timeout (tens of seconds); see ``wait_alive``."""
        kill_netns(self.netns)

    def start_node2(self) -> None:
        """(Re)join node 2 (a fresh tmpfs ``node_local_dir``, as after a reboot) and wait until it is ALIVE."""
        self._start_node2()

    def nodes(self) -> list[dict]:
        """The head's view: ``raytrain cluster status --json``'s node entries (ip, state, cpus, ...)."""
        return self.cli.json("cluster", "status", timeout=60).get("nodes", [])

    def alive_ips(self) -> set[str]:
        return {n.get("ip") for n in self.nodes() if n.get("state") == "ALIVE"}

    def wait_alive(self, ips: set[str], timeout_s: float = 90.0) -> None:
        """Wait until the set of ALIVE node IPs the head reports is exactly ``ips``."""
        deadline = time.monotonic() + timeout_s
        while (seen := self.alive_ips()) != ips:
            if time.monotonic() > deadline:
                raise AssertionError(f"alive nodes {sorted(seen)} != {sorted(ips)} after {timeout_s:.0f} s")
            time.sleep(1.0)

    def ray_env(self) -> dict[str, str]:
        """Environment for a process that calls ``ray.init(address=self.gcs_address)`` on the head's side."""
        return {**self.cli.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def run_ray(self, code: str, timeout: float = 120) -> dict:
        """Run ``code`` in a fresh Python with ``ray`` connected to the cluster (``ray.init`` done, the
        variables ``ray``, ``json``, ``gcs`` available); it must print one JSON line last, returned here."""
        prog = f"import json, ray\ngcs = {self.gcs_address!r}\nray.init(address=gcs, logging_level='ERROR')\n{code}\n"
        proc = subprocess.run(
            [sys.executable, "-c", prog], env=self.ray_env(), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise AssertionError(f"ray snippet exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return needs("root", "two-node tests need root (ip netns, veth, mount); run them as root")
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return needs(tool, f"two-node tests need `{tool}`")
    probe = "rt-mn-probe"
    proc = _sh("ip", "netns", "add", probe, check=False)
    if proc.returncode != 0:
        return needs("network namespaces", f"`ip netns add` failed: {proc.stderr.strip()}")
    _sh("ip", "netns", "del", probe, check=False)
    return None


@pytest.fixture(scope="session")
def two_nodes():
    """A head (root namespaces) and node 2 (netns ``rt-node2``, private tmpfs ``node_local_dir``), 1 CPU each,
    custom resources ``node_head`` / ``node_2``, both ALIVE. Session-scoped: a test that kills node 2 should
    call ``two_nodes.start_node2()`` afterwards (a finalizer) so later tests find two nodes again."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    port = os.environ.get("RAYTRAIN_TEST_MN_PORT") or str(free_port())
    dashboard_port = os.environ.get("RAYTRAIN_TEST_MN_DASHBOARD_PORT") or str(free_port(avoid={int(port)}))
    made: list[Path] = []

    def mkdtemp(prefix: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: Ray's socket paths < 108 bytes
        made.append(path)
        return path

    head_home, node2_home = mkdtemp("rt-mn-head-home-"), mkdtemp("rt-mn-node2-home-")
    head_temp, node2_temp = mkdtemp("rt-mnh-"), mkdtemp("rt-mn2-")
    record_cluster(head_home, head_temp, port, dashboard_port, "multinode-head")
    record_cluster(node2_home, node2_temp, port, dashboard_port, "multinode-node2", netns=NETNS, veth=VETH_ROOT)
    head_cli = CLI(_env(head_home, head_temp, port, dashboard_port))
    node2_cli = CLI(_env(node2_home, node2_temp, port, dashboard_port))
    node_local_dir, shared_dir = mkdtemp("rt-mn-local-"), mkdtemp("rt-mn-shared-")
    shared_dir.chmod(0o777)
    gcs_address = f"{HEAD_IP}:{port}"
    token_path = head_home / "auth_token"

    def start_node2() -> None:
        kill_netns()
        node2_cli("cluster", "down", "--force", timeout=60)  # forget a killed node's record
        cmd = [
            "ip", "netns", "exec", NETNS, "unshare", "--mount", "--propagation", "private",
            "sh", "-c", _NODE2_SHELL, "sh", str(node_local_dir),
            sys.executable, "-m", "raytrain.cli.main", "cluster", "join", gcs_address,
            "--token-file", str(token_path), "--num-cpus", "1", "--node-ip", NODE2_IP,
            "--resources", json.dumps({"node_2": 1}),
        ]
        proc = subprocess.run(
            cmd, env=node2_cli.env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
        )
        if proc.returncode != 0:
            raise AssertionError(f"node 2 did not join (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        nodes.wait_alive({HEAD_IP, NODE2_IP})
        # ALIVE comes before the head's scheduler sees the node's free CPU: an elastic job submitted in between
        # would rightly start on the head alone
        free = nodes.run_ray("import time\nt = time.monotonic() + 60\n"
                             "while ray.available_resources().get('node_2', 0) < 1 and time.monotonic() < t:\n"
                             "    time.sleep(0.2)\nprint(json.dumps(ray.available_resources()))")
        assert free.get("node_2", 0) >= 1, f"node 2 is ALIVE but its resources are not free after 60 s: {free}"

    nodes = TwoNodes(
        cli=head_cli, node2_cli=node2_cli, head_ip=HEAD_IP, node2_ip=NODE2_IP, gcs_address=gcs_address,
        token_path=token_path, node_local_dir=node_local_dir, shared_dir=shared_dir, netns=NETNS,
        _start_node2=start_node2,
    )
    try:
        _setup_network()
        head_cli(
            "cluster", "up", "--num-cpus", "1", "--node-ip", HEAD_IP, "--resources", json.dumps({"node_head": 1}),
            check=True, timeout=180,
        )
        start_node2()
        nodes.startup_s = time.monotonic() - t0
        print(f"\ntwo_nodes: head + node 2 up in {nodes.startup_s:.1f} s")
        yield nodes
    finally:
        node2_cli("cluster", "down", "--force", timeout=90)
        head_cli("cluster", "down", "--force", timeout=90)
        _teardown_network()
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
