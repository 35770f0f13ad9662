"""The embedded Ray cluster's head: ``ray start --head --block`` in its own session.

Single-node by default; with ``node_ip`` other machines can join it (`raytrain cluster join`, see ray_node).

Its record lives in ``$RAYTRAIN_HOME/cluster.json``. The head runs with Ray's token auth and a token
that only raytrain (and the user) can read, so raytrain's clients always authenticate and nothing else
on the machine can submit code to it. The dashboard listens on 127.0.0.1 only.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raytrain import paths
from raytrain.errors import ClusterError
from raytrain.targets.dashboard import Dashboard, token_headers

DEFAULT_PORT = int(os.environ.get("RAYTRAIN_PORT", 6379))
DEFAULT_DASHBOARD_PORT = int(os.environ.get("RAYTRAIN_DASHBOARD_PORT", 8265))
START_TIMEOUT_S = 90.0


@dataclass
class LocalCluster:
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

    @property
    def token(self) -> str:
        return Path(self.token_path).read_text().strip()

    def dashboard(self) -> Dashboard:
        return Dashboard(self.dashboard_url, token_headers(self.token))

    def process_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def to_dict(self) -> dict:
        return asdict(self)


def _record_path() -> Path:
    return paths.home() / "cluster.json"


def _token_path() -> Path:
    path = paths.home() / "auth_token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def _temp_dir() -> Path:
    # Ray's unix socket paths must stay short (< 108 bytes): keep the temp dir out of deep folders.
    override = os.environ.get("RAYTRAIN_RAY_TEMP_DIR")
    return Path(override) if override else Path(f"/tmp/raytrain-{os.getuid()}")


def _ray_executable() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else (shutil.which("ray") or "ray")


def current() -> LocalCluster | None:
    """The running embedded cluster, or None (a stale record is removed)."""
    record = _record_path()
    if not record.is_file():
        return None
    try:
        cluster = LocalCluster(**json.loads(record.read_text()))
    except (ValueError, TypeError):
        record.unlink(missing_ok=True)
        return None
    if not cluster.process_alive():
        record.unlink(missing_ok=True)
        return None
    return cluster


def _clear_stale_ray_state(temp_dir: Path) -> None:
    # After a stop, <temp>/ray_current_cluster makes the next ray.init() think a cluster is running.
    (temp_dir / "ray_current_cluster").unlink(missing_ok=True)


def up(
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    port: int = DEFAULT_PORT,
    dashboard_port: int = DEFAULT_DASHBOARD_PORT,
    node_ip: str | None = None,
    resources: dict | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> tuple[LocalCluster, bool]:
    """Start the local cluster (or return the running one). Returns (cluster, started_now).

    ``node_ip``: the address Ray's processes use (``--node-ip-address``), so other machines can join
    (`raytrain cluster join`); the GCS address is recorded with it. The dashboard stays on 127.0.0.1.
    ``resources``: custom resources of the head node (``{"node_a": 1}``).
    """
    from raytrain.targets import ray_node

    existing = current()
    if existing is not None:
        return existing, False
    joined = ray_node.current()
    if joined is not None:
        raise ClusterError(
            f"this RAYTRAIN_HOME runs a node joined to {joined.gcs_address} (raytrain cluster join); "
            "`raytrain cluster down` first"
        )
    temp_dir = _temp_dir()
    temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _clear_stale_ray_state(temp_dir)
    token_path = _token_path()
    log_path = paths.home() / "cluster.log"
    cmd = [
        _ray_executable(),
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
    if (port, dashboard_port) != (6379, 8265):
        # Ray's fixed defaults (client server 10001, agent 52365) would collide with another cluster on
        # this machine (a developer's own, or a test suite's): derive them from the dashboard port.
        offset = dashboard_port - 8265
        cmd += [
            f"--ray-client-server-port={20001 + offset % 10000}",
            f"--dashboard-agent-listen-port={52365 + offset % 10000}",
        ]
    cmd += ray_node.start_flags(num_cpus, num_gpus, node_ip, resources)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    cluster = LocalCluster(
        pid=proc.pid,
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
    deadline = time.monotonic() + timeout_s
    dashboard = cluster.dashboard()
    while True:
        if proc.poll() is not None:
            tail = ray_node.log_tail(log_path)
            raise ClusterError(f"`ray start --head` exited with {proc.returncode}; its log ({log_path}):\n{tail}")
        try:
            dashboard.get("/api/version", timeout=2)
            dashboard.get("/api/jobs/", timeout=5)
            if dashboard.nodes():
                break
        except ClusterError:
            pass
        if time.monotonic() > deadline:
            _terminate(proc.pid)
            raise ClusterError(f"the local Ray cluster did not come up within {timeout_s:.0f} s; see {log_path}")
        time.sleep(0.5)
    _record_path().write_text(json.dumps(cluster.to_dict(), indent=2))
    return cluster, True


def _terminate(pid: int, grace_s: float = 30.0) -> None:
    """SIGTERM ``ray start --block`` (it stops every process it started), SIGKILL the group if needed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def down() -> LocalCluster | None:
    """Stop the local cluster; returns what was stopped (None if nothing ran)."""
    cluster = current()
    if cluster is None:
        return None
    _terminate(cluster.pid)
    _clear_stale_ray_state(Path(cluster.temp_dir))
    _record_path().unlink(missing_ok=True)
    return cluster
