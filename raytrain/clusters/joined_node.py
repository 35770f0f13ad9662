"""A worker node joined to a Ray head elsewhere: ``ray start --address GCS --block`` in its own session.

`raytrain cluster join` starts it with the head's token (copied into ``$RAYTRAIN_HOME/node_auth_token``,
mode 600) and its own temp dir, records it in ``$RAYTRAIN_HOME/node.json`` and returns once the node is
registered with the head's GCS (``ray start`` prints "Ray runtime started." only after the GCS lists the
node). `raytrain cluster down` stops it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raytrain import paths, settings
from raytrain.clusters import ray_process
from raytrain.errors import ClusterError, ConfigError

JOIN_TIMEOUT_S = settings.get("RAYTRAIN_JOIN_TIMEOUT_S")
STARTED_MARK = "Ray runtime started."


log_tail = ray_process.log_tail


@dataclass
class WorkerNode:
    pid: int
    gcs_address: str
    temp_dir: str
    token_path: str
    log_path: str
    started_at: float
    node_ip: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict | None = None
    pid_started: float | None = None  # the process's start time: a record whose pid now names another is stale

    def process_alive(self) -> bool:
        return ray_process.same_process(self.pid, self.pid_started)


def _record_path() -> Path:
    return ray_process.record_path("node")


def current() -> WorkerNode | None:
    """The worker node this RAYTRAIN_HOME joined, or None (a stale record is removed)."""
    return ray_process.load_record(_record_path(), WorkerNode)


def _copy_token(token_file: str) -> Path:
    src = Path(token_file).expanduser()
    try:
        token = src.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {token_file}: cannot read it ({exc.strerror})", flag="--token-file")
    if not token:
        raise ConfigError(f"--token-file {token_file}: empty", flag="--token-file")
    dst = paths.home() / "node_auth_token"
    dst.unlink(missing_ok=True)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return dst


def join(
    gcs_address: str,
    *,
    token_file: str,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    node_ip: str | None = None,
    resources: dict | None = None,
    timeout_s: float = JOIN_TIMEOUT_S,
) -> tuple[WorkerNode, bool]:
    """Start a worker node joined to ``gcs_address`` (or return the running one). Returns (node, started_now)."""
    existing = current()
    if existing is not None:
        if existing.gcs_address != gcs_address:
            raise ClusterError(
                f"this RAYTRAIN_HOME already runs a node joined to {existing.gcs_address} (pid {existing.pid}); "
                "`raytrain cluster down` first"
            )
        return existing, False
    if ray_process.live_record("head") is not None:
        raise ClusterError("this RAYTRAIN_HOME runs a head (raytrain cluster up); `raytrain cluster down` first")
    host, sep, port = gcs_address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"GCS address {gcs_address!r}: expected HOST:PORT (as `raytrain cluster up` prints)")
    token_path = _copy_token(token_file)
    temp_dir = ray_process.prepare_temp_dir()
    log_path = paths.home() / "node.log"
    cmd = [
        "start",
        f"--address={gcs_address}",
        "--block",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        *ray_process.start_flags(num_cpus, num_gpus, node_ip, resources),
    ]
    proc = ray_process.spawn(cmd, token_path=token_path, log_path=log_path)
    node = WorkerNode(
        pid=proc.pid,
        pid_started=ray_process.started_at(proc.pid),
        gcs_address=gcs_address,
        temp_dir=str(temp_dir),
        token_path=str(token_path),
        log_path=str(log_path),
        started_at=time.time(),
        node_ip=node_ip,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=resources,
    )
    _wait_registered(node, proc, timeout_s)
    _record_path().write_text(json.dumps(asdict(node), indent=2))
    return node, True


def _wait_registered(node: WorkerNode, proc, timeout_s: float) -> None:
    """Until ``ray start`` says the head's GCS lists the node; stops it on a timeout."""
    gcs_address, log_path = node.gcs_address, node.log_path
    deadline = time.monotonic() + timeout_s
    while STARTED_MARK not in Path(log_path).read_text(errors="replace"):
        if proc.poll() is not None:
            tail = log_tail(log_path)
            why = "the head refused the token (--token-file must be a copy of the head's auth_token); " if (
                "InvalidAuthToken" in tail
            ) else ""
            raise ClusterError(
                f"{why}`ray start --address {gcs_address}` exited with {proc.returncode}; its log ({log_path}):\n"
                + tail
            )
        if time.monotonic() > deadline:
            ray_process.terminate(proc.pid, grace_s=5.0)  # not started: it may not heed SIGTERM
            raise ClusterError(
                f"the node did not register with the head at {gcs_address} within {timeout_s:.0f} s "
                f"(is the GCS port reachable from here, and the token the head's?); its log ({log_path}):\n"
                + log_tail(log_path)
            )
        time.sleep(0.5)


def down() -> WorkerNode | None:
    """Stop the joined worker node; returns what was stopped (None if nothing ran)."""
    node = current()
    if node is None:
        return None
    ray_process.stop(node.pid, node.temp_dir, _record_path())
    return node


def token_hint(token_path: str, gcs_address: str) -> str:
    """What `cluster up` prints so a user can join a second machine."""
    if gcs_address.startswith("127."):
        return f"token: {token_path} (to let other machines join, start with --node-ip ADDR)"
    return (
        f"token: {token_path}; to join another machine, copy it there and run:\n"
        f"  raytrain cluster join {gcs_address} --token-file PATH"
    )
