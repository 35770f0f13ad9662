"""Who listens on a local TCP port: the checks `cluster up` makes before starting Ray on a port and before
sending the cluster's token to whatever answers on the dashboard port."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from raytrain.errors import ClusterError

LISTEN = "0A"


def in_use(port: int) -> bool:
    """Whether some process already holds ``port`` (on any local address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover is no owner
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


# `ray start`'s default range for its worker processes' ports (--min-worker-port, --max-worker-port): Ray
# refuses, with a traceback, a component port inside it
RAY_WORKER_PORTS = range(10002, 20000)


def check_free(ports: dict[str, int]) -> None:
    """``{"--port": 6379, ...}``: a clear error naming the first port Ray cannot use (inside its worker ports'
    range, or taken) and how to choose another."""
    for flag, port in ports.items():
        env = {"--port": "RAYTRAIN_PORT", "--dashboard-port": "RAYTRAIN_DASHBOARD_PORT"}.get(flag)
        how = f"{flag} or {env}" if env else "--dashboard-port or RAYTRAIN_DASHBOARD_PORT (it derives this one)"
        if port in RAY_WORKER_PORTS:
            raise ClusterError(
                f"port {port} ({flag.lstrip('-')}) is inside the range Ray keeps for its worker processes "
                f"({RAY_WORKER_PORTS.start}-{RAY_WORKER_PORTS.stop - 1}); choose one outside it with {how} "
                "(e.g. 6379 and 8265, the defaults)"
            )
        if in_use(port):
            raise ClusterError(
                f"port {port} ({flag.lstrip('-')}) is already in use on this machine (another Ray cluster?); "
                f"choose a free one with {how}"
            )


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listener_pids(port: int) -> set[int] | None:
    """Pids (among those this user may inspect) holding a listening socket on ``port``; None where /proc
    cannot tell (not Linux). An empty set: nobody listens, or only processes of other users."""
    if not Path("/proc/net/tcp").exists():
        return None
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    pids: set[int] = set()
    if not targets:
        return pids
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in targets for fd in fds):
                pids.add(int(entry))
        except OSError:
            continue
    return pids


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def owned_by_session(port: int, session_id: int) -> bool | None:
    """Whether the listener on ``port`` belongs to the process session ``session_id`` (the ``ray start``
    raytrain started in its own session). None: /proc cannot tell on this system."""
    pids = listener_pids(port)
    if pids is None:
        return None
    if not pids:
        return False
    for pid in pids:
        try:
            if os.getsid(pid) != session_id:
                return False
        except OSError:
            return False
    return True
