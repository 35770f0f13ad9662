"""What the embedded head (local_cluster) and a joined node (ray_node) share: one ``ray start --block``
process in its own session, with token auth, a private temp dir and a JSON record in $RAYTRAIN_HOME."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def temp_dir() -> Path:
    # Ray's unix socket paths must stay short (< 108 bytes): keep the temp dir out of deep folders.
    override = os.environ.get("RAYTRAIN_RAY_TEMP_DIR")
    return Path(override) if override else Path(f"/tmp/raytrain-{os.getuid()}")


def prepare_temp_dir() -> Path:
    path = temp_dir()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    clear_stale_ray_state(path)
    return path


def clear_stale_ray_state(path: Path) -> None:
    # After a stop, <temp>/ray_current_cluster makes the next ray.init() think a cluster is running.
    (path / "ray_current_cluster").unlink(missing_ok=True)


def ray_executable() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else (shutil.which("ray") or "ray")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_record(path: Path, cls: type[T]) -> T | None:
    """The record at ``path`` if its process still runs; a stale or unreadable record is removed."""
    if not path.is_file():
        return None
    try:
        record = cls(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if not pid_alive(record.pid):  # type: ignore[attr-defined]
        path.unlink(missing_ok=True)
        return None
    return record


# Settings for a Ray node raytrain runs itself (bench/idle_cluster.py measures them against Ray's defaults;
# RAYTRAIN_QUIET_HEAD=0 turns them off, and any of them set in the environment wins):
QUIET_ENV = {
    "RAY_worker_niceness": "0",  # Ray runs workers at nice 15 under its own head processes at 0: on a busy
    #                              node the head would take cycles from training
    "RAY_enable_metrics_collection": "0",  # Prometheus metrics nobody scrapes on a raytrain-run node
    "RAY_event_stats": "0",  # per-event-loop statistics in every Ray process
    "METRICS_RECORD_INTERVAL_S": "60",  # the dashboard's own metrics (default 5 s)
    "REPORTER_UPDATE_INTERVAL_MS": "10000",  # per-node CPU/memory for `cluster status` (default 5 s)
}


def quiet_env() -> dict[str, str]:
    return {} if os.environ.get("RAYTRAIN_QUIET_HEAD", "1") == "0" else dict(QUIET_ENV)


def spawn(args: list[str], *, token_path: Path, log_path: Path) -> subprocess.Popen:
    """``ray ARGS`` in its own session (so Ctrl-C in the shell does not reach it), output to ``log_path``,
    authenticating with the token in ``token_path``."""
    env: dict[str, Any] = {
        **quiet_env(),
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for key in ("RAY_AUTH_TOKEN", "RAY_ADDRESS"):
        env.pop(key, None)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [ray_executable(), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def terminate(pid: int, grace_s: float = 30.0) -> None:
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
            if not pid_alive(pid):
                return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop(pid: int, temp: str, record: Path) -> None:
    terminate(pid)
    clear_stale_ray_state(Path(temp))
    record.unlink(missing_ok=True)
