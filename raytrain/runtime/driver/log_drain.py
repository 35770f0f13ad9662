"""The workers' last lines reach the job's log before the driver's last word.

A job's log is its driver's output. Ray forwards the workers' lines into it asynchronously: the log monitor
tails each worker's files and publishes batches through the GCS, and a thread in the driver prints them. A
driver that ends as soon as ``fit()`` returns loses whatever is still in flight: two ranks that printed 100,000
lines each at the end of training left 93,000 in the job's log. So every rank ends a train function that
returned with a ``log_end`` event (``raytrain.runtime.worker.loop``), the driver watches its own stdout for them
(:func:`install`), and after training :func:`wait` holds the outcome until every rank's has arrived: as long as
forwarded lines keep coming, at most ``DRAIN_S`` in all. What still misses is in each rank's own log.
"""
from __future__ import annotations

import sys
import threading
import time

from raytrain import events

DRAIN_S = 120.0  # the most the driver waits for the workers' lines after training returned
QUIET_S = 10.0  # ... and it stops sooner when no forwarded line arrived for this long
_NEEDLE = f'"event":"{events.LOG_END}"'


class _Watched:
    """``stream`` as it was (every attribute its own: not an io base class, whose defaults would shadow them),
    plus: the time of the last line written and the ``log_end`` events seen."""

    def __init__(self, stream, seen: "Seen"):
        self._stream, self._seen, self._partial = stream, seen, ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._seen.wrote(self, text)
        return written

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, buffer...: the stream's own
        return getattr(self._stream, name)


class Seen:
    def __init__(self):
        self.cond = threading.Condition()
        self.last_line = time.monotonic()
        self.ends: dict[int, int] = {}  # rank -> the world size it ended in

    def wrote(self, stream: _Watched, text: str) -> None:
        with self.cond:
            self.last_line = time.monotonic()
            lines = (stream._partial + text).split("\n")
            stream._partial = lines.pop()[-65536:]  # what follows the last newline (a huge unended line: its end)
            found = False
            for line in lines:
                if _NEEDLE in line:
                    for event in events.parse_events(line):
                        if event.get("event") == events.LOG_END and isinstance(event.get("rank"), int):
                            self.ends[event["rank"]] = int(event.get("world_size") or 1)
                            found = True
            if found:
                self.cond.notify_all()

    def missing(self) -> list[int]:
        """The ranks whose ``log_end`` has not arrived, of the world rank 0's says (all unknown: [0])."""
        world = self.ends.get(0)
        if world is None:
            return [0]
        return [r for r in range(world) if self.ends.get(r) != world]


SEEN = Seen()


def install() -> None:
    """Watch this process's stdout and stderr (before Ray's log thread starts printing into them)."""
    if not isinstance(sys.stdout, _Watched):
        sys.stdout = _Watched(sys.stdout, SEEN)
    if not isinstance(sys.stderr, _Watched):
        sys.stderr = _Watched(sys.stderr, SEEN)


def wait(drain_s: float = DRAIN_S, quiet_s: float = QUIET_S) -> list[int]:
    """Until every rank's ``log_end`` is in the log, forwarded lines stop coming for ``quiet_s``, or ``drain_s``
    passed. Returns the ranks still missing (and says so on stderr)."""
    deadline = time.monotonic() + drain_s
    with SEEN.cond:
        SEEN.last_line = max(SEEN.last_line, time.monotonic())  # the quiet time counts from now at the earliest
        while SEEN.missing():
            now = time.monotonic()
            left = min(deadline, SEEN.last_line + quiet_s) - now
            if left <= 0:
                break
            SEEN.cond.wait(min(left, 0.5))
        missing = SEEN.missing()
    if missing:
        why = f"within {drain_s:g} s" if time.monotonic() >= deadline else f"(no line came for {quiet_s:g} s)"
        print(f"raytrain: warning: the last lines of rank(s) {', '.join(map(str, missing))} did not reach the "
              f"job's log {why} after training ended; each rank's own log has them: "
              "raytrain jobs logs JOB --rank N", file=sys.stderr, flush=True)
    return missing
