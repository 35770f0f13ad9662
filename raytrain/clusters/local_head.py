"""The embedded Ray cluster's head: ``ray start --head --block`` in its own session.

Single-node by default; with ``node_ip`` other machines can join it (`raytrain cluster join`, see joined_node).

Its record lives in ``$RAYTRAIN_HOME/cluster.json``. The head runs with Ray's token auth and a token
that only raytrain (and the user) can read, so raytrain's clients always authenticate and nothing else
on the machine can submit code to it. The dashboard listens on 127.0.0.1 only.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raytrain import paths, settings
from raytrain.clusters import ports, ray_process
from raytrain.clusters.dashboard import Dashboard, token_headers
from raytrain.errors import ClusterError



def default_port() -> int:
    """The GCS port when none is given ($RAYTRAIN_PORT, read when used: a bad value is a clean error)."""
    return settings.get("RAYTRAIN_PORT")


def default_dashboard_port() -> int:
    return settings.get("RAYTRAIN_DASHBOARD_PORT")


START_TIMEOUT_S = 180.0  # `ray start` is slow on a small or loaded machine: room for it, still a bound
LOOPBACK = "127.0.0.1"
# Ray 2.60 rewrites --node-ip-address=127.0.0.1 to the machine's network address; this setting (its switch
# for single-machine Ray on macOS/Windows) makes every Ray process of the node use 127.0.0.1 instead.
SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass
class LocalHeadRecord:
    pid: int
    dashboard_url: str
    gcs_address: str
    temp_dir: str
    token_path: str
    log_path: str
    started_at: float
    num_cpus: float | None = None
    num_gpus: float | None = None
    node_ip: str | None = None
    resources: dict | None = None
    pid_started: float | None = None  # the process's start time: a record whose pid now names another is stale

    @property
    def token(self) -> str:
        return Path(self.token_path).read_text().strip()

    def dashboard(self) -> Dashboard:
        return Dashboard(self.dashboard_url, token_headers(self.token))

    def process_alive(self) -> bool:
        return ray_process.same_process(self.pid, self.pid_started)

    def to_dict(self) -> dict:
        return asdict(self)


def _record_path() -> Path:
    return ray_process.record_path("head")


def _fresh_token() -> Path:
    """A new token at every `cluster up` (written owner-only, then moved over the old one): a token that
    leaked from an earlier cluster opens nothing later."""
    path = paths.home() / "auth_token"
    tmp = path.with_name(f".auth_token.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.replace(tmp, path)
    return path


def current() -> LocalHeadRecord | None:
    """The running embedded cluster, or None (a stale record is removed)."""
    return ray_process.load_record(_record_path(), LocalHeadRecord)


def up(
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    port: int | None = None,
    dashboard_port: int | None = None,
    node_ip: str | None = None,
    resources: dict | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> tuple[LocalHeadRecord, bool]:
    """Start the local cluster (or return the running one). Returns (cluster, started_now).

    ``node_ip``: the address Ray's processes use (``--node-ip-address``), so other machines can join
    (`raytrain cluster join`); the GCS address is recorded with it. The dashboard stays on 127.0.0.1.
    ``resources``: custom resources of the head node (``{"node_a": 1}``).
    """
    port = default_port() if port is None else port
    dashboard_port = default_dashboard_port() if dashboard_port is None else dashboard_port
    existing = current()
    if existing is not None:
        return existing, False
    joined = ray_process.live_record("node")
    if joined is not None:
        raise ClusterError(
            f"this RAYTRAIN_HOME runs a node joined to {joined.get('gcs_address')} (raytrain cluster join); "
            "`raytrain cluster down` first"
        )
    temp_dir = ray_process.prepare_temp_dir()
    head = _head_command(port, dashboard_port, temp_dir)
    ports.check_free(_ports_of(head))
    token_path = _fresh_token()
    log_path = paths.home() / "cluster.log"
    cmd = head + ray_process.start_flags(num_cpus, num_gpus, node_ip, resources)
    deadline = time.monotonic() + timeout_s
    for attempt in range(1, START_ATTEMPTS + 1):
        proc = ray_process.spawn(cmd, token_path=token_path, log_path=log_path, extra_env=_address_env(node_ip))
        cluster = LocalHeadRecord(
            pid=proc.pid,
            pid_started=ray_process.started_at(proc.pid),
            dashboard_url=f"http://127.0.0.1:{dashboard_port}",
            gcs_address=f"{node_ip or '127.0.0.1'}:{port}",
            temp_dir=str(temp_dir),
            token_path=str(token_path),
            log_path=str(log_path),
            started_at=time.time(),
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            node_ip=node_ip,
            resources=resources,
        )
        try:
            _wait_until_up(cluster, proc, deadline - time.monotonic(), _client_port(head))
            break
        except RayletLate as exc:
            if attempt == START_ATTEMPTS or deadline - time.monotonic() < RAYLET_WAIT_S:
                raise ClusterError(f"{exc} (tried {attempt} time(s) within {timeout_s:.0f} s)") from None
            print(f"raytrain: {exc}; starting it once more", file=sys.stderr, flush=True)
    _record_path().write_text(json.dumps(cluster.to_dict(), indent=2))
    return cluster, True


class RayletLate(ClusterError):
    """``ray start`` gave up on its raylet registering (Ray's fixed wait): a loaded machine, worth another try."""


RAYLET_LATE = "The current node timed out during startup"  # what `ray start` says then (its node module)
# Ray Client's server starts before the dashboard and the raylet, and gives up when the raylet has not
# registered 30 s later (Ray's services.get_node_with_retry); `ray start --block` then stops the whole node,
# after the dashboard may already have answered. What its log (whose tail `ray start` prints) says then.
CLIENT_SERVER_LATE = "Timed out waiting for node info"
RAYLET_WAIT_S = 30.0  # ray start's fixed wait for that (not a setting of Ray's)
START_ATTEMPTS = 2
DEFAULT_CLIENT_PORT = 10001  # Ray Client's server's port when `ray start` is given none


def _head_command(port: int, dashboard_port: int, temp_dir: Path) -> list[str]:
    """``ray start --head --block`` with the dashboard on 127.0.0.1 and every port derived from ours."""
    cmd = [
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        "--include-dashboard=true",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    if ray_process.quiet():
        # The autoscaler monitor of a single node that never scales: not started (0.1 % of a core on an idle
        # head, bench/idle_cluster.py; nothing of raytrain's reads it). Nor is Ray Client's server
        # (raytrain.ray_tuning.ray_start). RAYTRAIN_RAY_TUNING=off brings Ray's defaults back.
        cmd.append("--no-monitor")
    if (port, dashboard_port) != (6379, 8265):
        # Ray's fixed defaults (client server 10001, agent 52365) would collide with another cluster on
        # this machine (a developer's own, or a test suite's): derive them from the dashboard port.
        offset = dashboard_port - 8265
        # A derived port may equal one given (--port 53129 with --dashboard-port 59029: the agent's is 53129 too)
        client = _unused(20001 + offset % 10000, {port, dashboard_port})
        agent = _unused(52365 + offset % 10000, {port, dashboard_port, client})
        cmd += [f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"]
    return cmd


def _client_port(head_command: list[str]) -> int | None:
    """The port Ray Client's server of this head will listen on; None where it starts none (a tuning)."""
    from raytrain import ray_tuning

    if ray_tuning.on("no_ray_client", say=False):  # the head says so in its log where it is off
        return None
    return _ports_of(head_command).get("--ray-client-server-port", DEFAULT_CLIENT_PORT)


def _unused(port: int, taken: set[int]) -> int:
    while port in taken:
        port += 1
    return port


def _address_env(node_ip: str | None) -> dict[str, str]:
    """Loopback unless --node-ip: GCS, raylet and object manager then advertise 127.0.0.1, not this machine's
    network address (with --node-ip other machines can join: they must reach it)."""
    return {} if node_ip else dict(SINGLE_MACHINE_ENV)


def _ports_of(head_command: list[str]) -> dict[str, int]:
    """The TCP ports ``ray start --head`` will listen on, by the flag that sets them."""
    out = {}
    for arg in head_command:
        flag, _, value = arg.partition("=")
        if flag in ("--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port"):
            out[flag] = int(value)
    return out


def _confirm_own_dashboard(cluster: LocalHeadRecord, proc, deadline: float) -> None:
    """Wait until the dashboard port listens, then check the listener is a process of the ``ray start``
    raytrain started (its own session) before the token is sent there."""
    port = int(cluster.dashboard_url.rsplit(":", 1)[1])
    while not ports.listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            return  # _wait_until_up reports the exit or the timeout
        time.sleep(0.3)
    if ports.owned_by_session(port, proc.pid) is False:
        ray_process.terminate(proc.pid)
        raise ClusterError(
            f"another process listens on the dashboard port {port}, not the Ray head raytrain started; "
            "raytrain did not send it the cluster's token. Stop it, or choose another port with "
            "--dashboard-port or RAYTRAIN_DASHBOARD_PORT"
        )


def _wait_until_up(cluster: LocalHeadRecord, proc, timeout_s: float, client_port: int | None = None) -> None:
    """Until the dashboard answers, its Jobs API too, and it lists a node, and Ray Client's server listens on
    ``client_port`` (None: the head starts none); stops the head on a timeout."""
    log_path = cluster.log_path
    deadline = time.monotonic() + timeout_s
    _confirm_own_dashboard(cluster, proc, deadline)
    dashboard = cluster.dashboard()
    while True:
        _check_running(proc, log_path)
        try:
            dashboard.get("/api/version", timeout=2)
            dashboard.get("/api/jobs/", timeout=5)
            if dashboard.nodes():
                break
        except ClusterError:
            pass
        _check_deadline(proc, deadline, timeout_s, log_path)
        time.sleep(0.5)
    # It listens once past its wait for the raylet (CLIENT_SERVER_LATE): the one start-up step that can still
    # stop the node after the dashboard answered
    while client_port is not None and not ports.listening(client_port):
        _check_running(proc, log_path)
        _check_deadline(proc, deadline, timeout_s, log_path)
        time.sleep(0.3)


def _check_running(proc, log_path: str) -> None:
    if proc.poll() is None:
        return
    ray_process.reap_group(proc.pid)  # what it started before failing must not hold the ports
    tail = ray_process.log_tail(log_path)
    if RAYLET_LATE in tail:
        raise RayletLate(f"Ray's raylet did not register within Ray's fixed {RAYLET_WAIT_S:.0f} s (a loaded "
                         f"machine?); see {log_path}")
    if CLIENT_SERVER_LATE in tail:
        raise RayletLate(f"Ray Client's server gave up on the raylet registering within Ray's fixed "
                         f"{RAYLET_WAIT_S:.0f} s, and Ray stopped the node (a loaded machine?); see {log_path}")
    raise ClusterError(f"`ray start --head` exited with {proc.returncode}; its log ({log_path}):\n{tail}")


def _check_deadline(proc, deadline: float, timeout_s: float, log_path: str) -> None:
    if time.monotonic() > deadline:
        ray_process.terminate(proc.pid)
        raise ClusterError(f"the local Ray cluster did not come up within {timeout_s:.0f} s; see {log_path}")


def down() -> LocalHeadRecord | None:
    """Stop the local cluster; returns what was stopped (None if nothing ran)."""
    cluster = current()
    if cluster is None:
        return None
    ray_process.stop(cluster.pid, cluster.temp_dir, _record_path())
    shutil.rmtree(paths.job_code_root(), ignore_errors=True)  # the copies jobs ran from (targets/local.py)
    return cluster
