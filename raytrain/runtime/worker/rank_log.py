"""Every rank's stdout and stderr, also kept in the run's record (``<run>/raytrain/logs/rank-N.log``), so that
`jobs logs ID --rank N` (or ``--node``) works after the cluster has stopped and a failure can show the failing
rank's last lines.

Captured at the file-descriptor level: fd 1 and fd 2 of the worker process are pointed at a pipe each, read
by a ``tee -a`` process that writes on to the original fd (what Ray captures: Ray still gets everything) and
appends to a file on the node's local disk. So the file has what Python prints and also what C extensions,
``os.write`` and child processes write. The ``tee`` is a process of its own, not a thread: it drains the pipe
until every writer has gone, so the last lines before a hard crash (a segfault, a SIGKILL) still reach the
file. Where no ``tee`` exists, Python-level writes (print, logging, tracebacks, tqdm) are copied instead.

Nothing here writes to the storage: a process of its own (``rank_log_copy``) copies the local file to
``<run>/raytrain/logs/rank-N.log`` every ``COPY_EVERY_S``, and finally once the writers are gone, so a storage
that hangs never blocks the worker's next ``print``."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

_captured: dict[int, int] = {}  # fd -> a duplicate of what it was before capture (Ray's log)
_alive: list[int] = []  # without tee: this process holds the copier's pipe open until it exits
_copiers: list[subprocess.Popen] = []
_local: Path | None = None  # this process's rank log on the node's disk, once started

# The copy to the storage: how often, after how long a copy that has not returned is said, and how long the
# final copy (once the rank's writers are gone) may take before it is given up (the local file is kept).
COPY_EVERY_S = 1.0
COPY_STALL_S = 30.0
FINAL_COPY_S = 60.0
DETACH_WAIT_S = 10.0  # how long a rank's start waits for its copier to fork away (~30 ms on an idle node)


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


def capture_fds(path: Path, fds: tuple[int, ...] = (1, 2), pass_fds: tuple[int, ...] = ()) -> bool:
    """Point each of ``fds`` at a pipe into ``tee -a path`` whose output is the fd's old target; each ``tee``
    also holds ``pass_fds`` open. False (and nothing changed) where there is no ``tee``. A second call (a new
    rank in the same process) restores first."""
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
                         start_new_session=True, pass_fds=pass_fds)
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


def write_own(text: str) -> bool:
    """Append ``text`` to this rank's log alone (not the job's); False where this process keeps none."""
    if _local is None:
        return False
    _flush_python_streams()  # what was printed before comes before it
    try:
        with open(_local, "a", errors="replace") as f:  # O_APPEND, as the tee's own writes
            f.write(text)
        return True
    except OSError:
        return False


def local_dir() -> Path:
    """This user's private folder for rank logs on this node's local disk."""
    import tempfile

    from raytrain import paths

    return paths.private_dir(paths.private_dir(Path(tempfile.gettempdir()) / f"raytrain-{os.getuid()}") / "rank-logs")


def start_copier(local: Path, dest: Path, rank: int, alive_fd: int) -> None:
    """The process that copies ``local`` to ``dest`` until ``alive_fd``'s other end is closed everywhere
    (raytrain.runtime.worker.rank_log_copy); it writes its own failures to this process's stdout/stderr as they are
    now (Ray's log).

    Returns once the copier has forked away (its first process exited; at most ``DETACH_WAIT_S``): until then it
    is this worker's child, which Ray kills when the worker exits. A run shorter than the copier's start-up (one
    step, on a loaded node) otherwise lost its whole rank log: the worker was gone before the copier had forked."""
    script = Path(__file__).with_name("rank_log_copy.py")
    proc = subprocess.Popen(
        [sys.executable, "-S", str(script), str(local), str(dest), str(rank), str(alive_fd),
         str(COPY_EVERY_S), str(COPY_STALL_S), str(FINAL_COPY_S)],
        stdin=subprocess.DEVNULL, pass_fds=(alive_fd,), start_new_session=True,
    )
    try:
        proc.wait(timeout=DETACH_WAIT_S)
    except subprocess.TimeoutExpired:  # a node too loaded to start it in time: go on (reaped by subprocess later)
        _copiers.append(proc)


def start(record_dir: Path | None, rank: int, ip: str = "") -> Path | None:
    """Copy this process's stdout/stderr to ``record_dir``/logs/rank-N.log (appended: a restart adds to it),
    through a file on this node (written at once) that a process of its own copies to the storage. Returns
    the storage's path of the log."""
    if record_dir is None:
        return None
    dest = record_dir / "logs" / f"rank-{rank}.log"
    try:  # a file of its own for each start: copiers of two starts never copy the same bytes
        local = local_dir() / f"{record_dir.parent.name}-rank-{rank}-{os.getpid()}-{time.time_ns()}.log"
        fd = os.open(local, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "a", errors="replace") as f:
            f.write(header(rank, socket.gethostname(), ip))
    except Exception:  # noqa: BLE001 - no rank log never fails the job
        return None
    global _local
    _local = local
    alive_read, alive_write = os.pipe()
    _flush_python_streams()
    try:
        start_copier(local, dest, rank, alive_read)
    except OSError:
        os.close(alive_write)
        return None
    finally:
        os.close(alive_read)
    try:
        if capture_fds(local, pass_fds=(alive_write,)):
            os.close(alive_write)  # the tees hold it now: the copier ends after them
            return dest
        copy = open(local, "a", buffering=1, errors="replace")
    except OSError:
        os.close(alive_write)
        return None
    _alive.append(alive_write)  # held until this process exits
    sys.stdout = Tee(sys.stdout, copy)
    sys.stderr = Tee(sys.stderr, copy)
    return dest
