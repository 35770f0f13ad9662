"""Copies a rank's log from the node's local disk to the run's storage, off the worker's way (raytrain.runtime.
rank_log starts it): a storage that hangs (a network file system that stopped answering) blocks this process's
copy, never the worker's next ``print``.

Its own process, started with ``python -S FILE`` (standard library only, nothing of raytrain imported), which
forks away from the worker (Ray kills a worker's children with it), so the last lines of a worker that died
hard (a segfault, a SIGKILL) are still copied: it copies what is new every
``every_s``, and once the writers are gone (``alive_fd`` reads end-of-file: every ``tee``, or the worker itself,
held its other end) it makes the final copy, removes the local file and exits. A copy that has not returned
after ``stall_s`` is said once; a final copy that has not finished ``final_s`` after the writers are gone is
given up: it says so (a ``rank_log`` event and a line, on the worker's original stdout/stderr: Ray's log of it)
and leaves the local file where the line says.

    python -S rank_log_copy.py LOCAL DEST RANK ALIVE_FD EVERY_S STALL_S FINAL_S
"""
from __future__ import annotations

import json
import os
import select
import sys
import threading
import time

MARKER = "@@raytrain "  # raytrain.events.MARKER (this file imports nothing of raytrain)
EVENT = "rank_log"  # raytrain.events.RANK_LOG


class Copier:
    """Appends what ``src`` gained since the last pass to ``dest``, one pass at a time on a thread of its own
    (a pass stuck in the file system holds up nothing but itself)."""

    def __init__(self, src: str, dest: str):
        self.src, self.dest = src, dest
        self.offset = 0
        self.thread: threading.Thread | None = None
        self.started = 0.0
        self.error: str | None = None

    def busy_s(self) -> float:
        """How long the pass now running has run (0: none runs)."""
        return time.monotonic() - self.started if self.thread is not None and self.thread.is_alive() else 0.0

    def kick(self) -> None:
        """Start a pass unless one runs."""
        if self.thread is None or not self.thread.is_alive():
            self.started = time.monotonic()
            self.thread = threading.Thread(target=self._pass, daemon=True)
            self.thread.start()

    def done(self) -> bool:
        """The last pass has finished, without an error, with nothing left to copy."""
        if self.thread is not None and self.thread.is_alive():
            return False
        try:
            return self.error is None and os.path.getsize(self.src) <= self.offset
        except OSError:
            return True  # nothing left to copy from

    def _pass(self) -> None:
        try:
            with open(self.src, "rb") as f:
                f.seek(self.offset)
                data = f.read()
            if data or not os.path.exists(self.dest):
                os.makedirs(os.path.dirname(self.dest), mode=0o700, exist_ok=True)
                fd = os.open(self.dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
            self.offset += len(data)
            self.error = None
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def say(rank: int, state: str, dest: str, local: str, reason: str, line: str) -> None:
    event = {"event": EVENT, "rank": rank, "state": state, "log": dest, "local": local, "reason": reason}
    for fd, text in ((1, MARKER + json.dumps(event, separators=(",", ":")) + "\n"), (2, line + "\n")):
        try:
            os.write(fd, text.encode(errors="replace"))
        except OSError:
            pass


def ended(alive_fd: int, timeout_s: float) -> bool:
    """Whether every writer is gone (end of file on ``alive_fd``), waiting up to ``timeout_s``."""
    ready, _, _ = select.select([alive_fd], [], [], timeout_s)
    return bool(ready) and not os.read(alive_fd, 4096)


def main(argv: list[str]) -> int:
    local, dest, rank, alive_fd = argv[1], argv[2], int(argv[3]), int(argv[4])
    every_s, stall_s, final_s = (float(v) for v in argv[5:8])
    copier, stalled = Copier(local, dest), False
    while not ended(alive_fd, every_s):
        copier.kick()
        if not stalled and copier.busy_s() > stall_s:
            stalled = True
            say(rank, "stalled", dest, local, f"a copy has not returned in {stall_s:g} s",
                f"raytrain: rank {rank}'s log: the storage has not answered a copy to {dest} in {stall_s:g} s; "
                f"the log goes on locally ({local}) and is copied when the storage answers")
    deadline = time.monotonic() + final_s
    while time.monotonic() < deadline:
        copier.kick()
        copier.thread.join(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
        if copier.done():
            try:
                os.unlink(local)
            except OSError:
                pass
            return 0
        if copier.error is not None and not copier.thread.is_alive():
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # a failed pass: try again shortly
    reason = copier.error or f"the storage did not take the last lines within {final_s:g} s"
    say(rank, "copy_failed", dest, local, reason,
        f"raytrain: rank {rank}'s log could not be copied to {dest} ({reason}); it stays on this node at {local}")
    return 1


if __name__ == "__main__":
    # No child of the worker: Ray kills a worker's child processes with it, which would cut the final copy.
    if os.fork():
        os._exit(0)
    os._exit(main(sys.argv))  # a pass stuck in the file system must not keep the process
