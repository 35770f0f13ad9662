"""Every rank's stdout and stderr, also kept in the run's record (``<run>/raytrain/logs/rank-N.log``), so that
`jobs logs ID --rank N` (or ``--node``) works after the cluster has stopped and a failure can show the failing
rank's last lines.

Captured at the file-descriptor level: fd 1 and fd 2 of the worker process are pointed at a pipe each, read
by a ``tee -a`` process that writes on to the original fd (what Ray captures: Ray still gets everything) and
appends to the rank's file. So the file has what Python prints and also what C extensions, ``os.write`` and
child processes write. The ``tee`` is a process of its own, not a thread: it drains the pipe until every
writer has gone, so the last lines before a hard crash (a segfault, a SIGKILL) still reach the file. Where
no ``tee`` exists, Python-level writes (print, logging, tracebacks, tqdm) are copied instead."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from raytrain import paths

_captured: dict[int, int] = {}  # fd -> a duplicate of what it was before capture (Ray's log)


class Tee:
    """Writes go to ``stream`` (what Ray captures) and to ``copy``; a failing copy never fails the job. Not an
    io class: everything else (fileno, isatty, encoding, buffer) is the real stream's."""

    def __init__(self, stream: TextIO, copy: TextIO):
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        try:
            self.copy.write(text)
            self.copy.flush()
        except (OSError, ValueError):
            pass
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def header(rank: int, host: str, ip: str) -> str:
    return f"# raytrain rank {rank} on {host} ({ip}) at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def capture_fds(path: Path, fds: tuple[int, ...] = (1, 2)) -> bool:
    """Point each of ``fds`` at a pipe into ``tee -a path`` whose output is the fd's old target. False (and
    nothing changed) where there is no ``tee``. A second call (a new rank in the same process) restores first."""
    tee = shutil.which("tee")
    if tee is None:
        return False
    release()
    _flush_python_streams()
    for fd in fds:
        original = os.dup(fd)
        read, write = os.pipe()
        # -i: a Ctrl-C meant for the job does not cut its log short; a session of its own: nor does a signal
        # to the worker's process group. It ends at EOF, when the last writer (the worker, its children) exits.
        subprocess.Popen([tee, "-a", "-i", str(path)], stdin=read, stdout=original, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        os.close(read)
        os.dup2(write, fd)
        os.close(write)
        _captured[fd] = original
    return True


def release() -> None:
    """Give each captured fd its old target back (the ``tee`` drains what is left and exits)."""
    _flush_python_streams()
    for fd, original in list(_captured.items()):
        os.dup2(original, fd)
        os.close(original)
        del _captured[fd]


def start(record_dir: Path | None, rank: int, ip: str = "") -> Path | None:
    """Copy this process's stdout/stderr to ``record_dir``/logs/rank-N.log (appended: a restart adds to it)."""
    if record_dir is None:
        return None
    path = record_dir / "logs" / f"rank-{rank}.log"
    try:
        paths.private_mkdir(path.parent)  # 0700/0600: a rank's log holds the job's whole output
        with paths.private_open(path, "a", errors="replace") as f:
            f.write(header(rank, socket.gethostname(), ip))
        if capture_fds(path):
            return path
        copy = paths.private_open(path, "a", buffering=1, errors="replace")
    except OSError:
        return None
    sys.stdout = Tee(sys.stdout, copy)
    sys.stderr = Tee(sys.stderr, copy)
    return path
