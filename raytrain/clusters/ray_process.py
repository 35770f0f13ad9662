"""What the embedded head (local_head) and a joined node (joined_node) share: one ``ray start --block``
process in its own session, with token auth, a private temp dir and a JSON record in $RAYTRAIN_HOME (one
such process per RAYTRAIN_HOME); and the ``ray start`` flags both take (checked as `cluster up` and
`cluster join` give them)."""
from __future__ import annotations

import errno
import ipaddress
import json
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, TypeVar

from raytrain import paths, settings
from raytrain.errors import ClusterError, ConfigError

T = TypeVar("T")

# The record of the one `ray start` process of a RAYTRAIN_HOME, by role.
RECORDS = {"head": "cluster.json", "node": "node.json"}


def record_path(role: str) -> Path:
    return paths.home() / RECORDS[role]


def live_record(role: str) -> dict | None:
    """The raw record of this RAYTRAIN_HOME's head or joined node while its process runs, else None."""
    return load_record(record_path(role), dict)


def temp_dir() -> Path:
    # Ray's unix socket paths must stay short (< 108 bytes): keep the temp dir out of deep folders.
    override = settings.raw("RAYTRAIN_RAY_TEMP_DIR")
    return Path(override) if override else Path(f"/tmp/raytrain-{os.getuid()}")


def prepare_temp_dir() -> Path:
    """Ray's temp dir: ``<temp_dir()>/r``. Ray makes the folder it is given writable by everyone (0777, for
    several users on one machine); its parent is checked to be this user's own (paths.private_dir) and stays
    0700, so no other user can reach Ray's sockets, logs or session files."""
    path = paths.private_dir(temp_dir()) / "r"
    path.mkdir(exist_ok=True, mode=0o700)
    clear_stale_ray_state(path)
    return path


def clear_stale_ray_state(path: Path) -> None:
    # After a stop, <temp>/ray_current_cluster makes the next ray.init() think a cluster is running.
    (path / "ray_current_cluster").unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since boot (None where /proc cannot tell). Since boot, not a
    wall-clock time: /proc's boot time moves whenever the wall clock is stepped (NTP, a VM resumed), so a
    wall-clock start time computed later can differ from the recorded one by many seconds, and the running
    cluster would then be taken for another process and forgotten (`cluster status`: none running; the next
    `cluster up`: "port in use")."""
    from raytrain.timings import process_started_since_boot

    return process_started_since_boot(pid)


_WALL_CLOCK = 1e9  # a recorded start above this is a wall-clock time (records written before 0.1.0's fix)


def same_process(pid: int, pid_started: float | None) -> bool:
    """``pid`` runs and is the process that started at ``pid_started`` (after a reboot, or once the pid is
    reused, it names another process, which must never be stopped as ours)."""
    if not pid_alive(pid):
        return False
    if pid_started is None:
        return True  # a record from before start times were kept: the pid is all there is
    if pid_started > _WALL_CLOCK:  # an older record: compare wall-clock times, allowing for clock steps
        from raytrain.timings import process_start_time

        now = process_start_time(pid)
        return now is None or abs(now - pid_started) < 120.0
    now = started_at(pid)
    return now is None or abs(now - pid_started) < 0.05


def load_record(path: Path, cls: type[T]) -> T | None:
    """The record at ``path`` if its process still runs; a stale or unreadable record is removed."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        record = cls(**data)
        pid = data["pid"]
    except (ValueError, TypeError, KeyError):
        path.unlink(missing_ok=True)
        return None
    if not same_process(pid, data.get("pid_started")):
        path.unlink(missing_ok=True)
        return None
    return record


# Settings for a Ray node raytrain runs itself (bench/idle_cluster.py measures them against Ray's defaults;
# RAYTRAIN_RAY_TUNING=off turns them off, and any of them set in the environment wins; each is a variable Ray
# reads, which a Ray that does not know it ignores). Each one is a period of
# something a raytrain-run node does not need often: an idle head's processes wake up far less.
QUIET_ENV = {
    "RAY_worker_niceness": "0",  # Ray runs workers at nice 15 under its own head processes at 0: on a busy
    #                              node the head would take cycles from training
    "RAY_enable_metrics_collection": "0",  # Prometheus metrics nobody scrapes on a raytrain-run node
    "RAY_event_stats": "0",  # per-event-loop statistics in every Ray process
    "METRICS_RECORD_INTERVAL_S": "60",  # the dashboard's own metrics (default 5 s)
    "REPORTER_UPDATE_INTERVAL_MS": "10000",  # per-node CPU/memory for `cluster status` (default 5 s)
    # the log monitor globs the log folder for new files on every 0.1 s poll while it tracks fewer than
    # RAY_LOG_MONITOR_MANY_FILES_THRESHOLD (1000) files, and every LOG_NAME_UPDATE_INTERVAL_S above: with the
    # threshold at 0 it looks for new files every 2 s (a quarter of the idle head's CPU). Lines of files it
    # already follows are still read every 0.1 s; a new worker's log is read from its start once found, so
    # nothing is lost, its first lines only reach the job's log up to 2 s later
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "2",
    # the dashboard agent: its parent check (0.4 s), event-loop lag probe (0.25 s), event reports (0.1 s), the
    # event folder scan (2 s), the aggregator's main-thread probe (0.1 s)
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "2",
    "RAY_DASHBOARD_AGENT_LOOP_MONITOR_INTERVAL_S": "5",
    "EVENT_AGENT_REPORT_INTERVAL_SECONDS": "1",
    "SCAN_EVENT_DIR_INTERVAL_SECONDS": "10",
    "RAY_DASHBOARD_AGGREGATOR_AGENT_CHECK_MAIN_THREAD_LIVENESS_INTERVAL_SECONDS": "2",
    "AUTOSCALER_UPDATE_INTERVAL_S": "30",  # the autoscaler monitor of a node that never scales (5 s)
    # raylet and GCS: object-store GC check (100 ms), memory monitor (250 ms), resource-load pulls for the
    # autoscaler (1 s), debug state dumps (10 s)
    "RAY_raylet_check_gc_period_milliseconds": "1000",
    "RAY_memory_monitor_refresh_ms": "1000",
    "RAY_gcs_pull_resource_loads_period_milliseconds": "5000",
    "RAY_debug_dump_period_milliseconds": "60000",
}
def quiet(env: Mapping[str, str] | None = None) -> bool:
    """Whether a node raytrain starts runs quieter than Ray's defaults (unless ``RAYTRAIN_RAY_TUNING=off``)."""
    from raytrain import ray_tuning

    return ray_tuning.switched_on(env)


def quiet_env() -> dict[str, str]:
    return dict(QUIET_ENV) if quiet() else {}


# Ray's dashboard gives each of its module processes 30 s to start, then exits, and `ray start --head --block`
# stops the node with it. On a loaded 2-core machine a module took longer (Ray 2.58, MetricsHead, with another
# cluster starting beside it). Ray's own setting, tunings on or off; still inside START_TIMEOUT_S; a value in
# the environment wins.
START_ENV = {"RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "120"}


def spawn(args: list[str], *, token_path: Path, log_path: Path, extra_env: dict | None = None) -> subprocess.Popen:
    """``ray ARGS`` in its own session (so Ctrl-C in the shell does not reach it), output to ``log_path``,
    authenticating with the token in ``token_path``; through ``raytrain.ray_tuning.ray_start``, which loads
    only the dashboard modules raytrain uses."""
    env: dict[str, Any] = {
        **START_ENV,
        **quiet_env(),
        **os.environ,
        **(extra_env or {}),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for key in ("RAY_AUTH_TOKEN", "RAY_ADDRESS"):
        env.pop(key, None)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "raytrain.ray_tuning.ray_start", *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def terminate(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM ``ray start --block`` (it stops every process it started), SIGKILL the group if needed, and
    end whatever of its session outlived it (see ``reap_group``). Once a job has run on it, Ray 2.60's
    ``ray start --block`` heeds the SIGTERM only after about 30 s (not one of its processes had exited 24 s
    later): after ``grace_s`` every process of the session gets the SIGTERM itself (GCS, raylet, dashboard
    and agents stop on it) and, 5 s later, SIGKILL: `cluster down` does not wait out Ray's 30 s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        reap_group(pid)
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        except ChildProcessError:
            if not pid_alive(pid):
                break
        time.sleep(0.2)
    reap_group(pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's group with a reused id: not ours to touch
        return False


def reap_group(pgid: int, grace_s: float = 5.0) -> None:
    """End every process left in the session ``ray start`` ran in (it is started as a session leader, so the
    session id is its pid). A ``ray start --head`` that fails or times out on a busy machine exits without
    stopping what it had started (the GCS, the raylet, the dashboard and its agents), which then hold the
    cluster's ports and make the next ``cluster up`` fail with "port in use"."""
    if not _group_alive(pgid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop(pid: int, temp: str, record: Path) -> None:
    terminate(pid)
    clear_stale_ray_state(Path(temp))
    record.unlink(missing_ok=True)


# -- the `ray start` flags `cluster up` and `cluster join` share ------------------------------------------
def parse_resources(text: str | None) -> dict[str, float] | None:
    """``--resources '{"node_a": 1}'`` -> a dict of custom resources (names to non-negative amounts)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--resources {text!r}: not JSON ({exc}); e.g. '{{\"node_a\": 1}}'", flag="--resources")
    if not isinstance(value, dict):
        raise ConfigError(f"--resources {text!r}: must be a JSON object, e.g. '{{\"node_a\": 1}}'", flag="--resources")
    for name, amount in value.items():
        if name in ("CPU", "GPU"):
            raise ConfigError(f"--resources: {name} is set with --num-{name.lower()}s", flag="--resources")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError(f"--resources: {name!r} must be a number >= 0, not {amount!r}", flag="--resources")
    return value


def check_node_ip(ip: str | None) -> str | None:
    """``--node-ip``: an IP address of this machine (Ray's processes bind to it)."""
    if ip is None:
        return None
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise ConfigError(f"--node-ip {ip!r}: not an IP address", flag="--node-ip")
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"--node-ip {ip}: not an address of this machine", flag="--node-ip")
            raise ClusterError(f"--node-ip {ip}: cannot bind to it ({exc})")
    return str(addr)


def start_flags(num_cpus, num_gpus, node_ip, resources) -> list[str]:
    """The `ray start` flags `up` and `join` share."""
    flags = []
    if num_cpus is not None:
        flags.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        flags.append(f"--num-gpus={num_gpus:g}")
    if node_ip is not None:
        flags.append(f"--node-ip-address={node_ip}")
    if resources:
        flags.append(f"--resources={json.dumps(resources)}")
    return flags
