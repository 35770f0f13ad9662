"""The workers' last lines reach the job's log before the driver's last word.

A job's log is its driver's output. Ray forwards the workers' lines into it asynchronously: the log monitor
tails each worker's files and publishes batches through the GCS, and a thread in the driver prints them. A
driver that ends as soon as ``fit()`` returns loses whatever is still in flight: two ranks that printed 100,000
lines each at the end of training left 93,000 in the job's log. So every rank ends a train function that
returned with a ``log_end`` event (``raytrain.runtime.worker.loop``), the driver watches its own stdout for them
(:func:`install`), and after training :func:`wait` holds the outcome until every rank's has arrived: as long as
forwarded lines keep coming, at most ``DRAIN_S`` in all. Then every event a rank recorded since this driver
started (each rank appends its events to the run's record itself) that never reached the log is copied into
it: a rank's last lines that still did not come (a node's log monitor starved on a loaded machine), or lines
lost mid-run (a worker that died for a restart, whose last lines Ray did not forward). So the job's facts lose
none; a rank's other lines are in its own log.
"""
from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import Path

from raytrain import events

DRAIN_S = 120.0  # the most the driver waits for the workers' lines after training returned
QUIET_S = 10.0  # ... and it stops sooner when no forwarded line arrived for this long
_NEEDLE = f'"event":"{events.LOG_END}"'
RECENT = 50_000  # the event lines remembered as seen (older ones: the record's lines before them are not judged)
REPLAY_MAX = 2_000  # at most this many of a rank's last recorded lines are read (and so copied) at the end


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
        self.recent: collections.deque[tuple[str, float]] = collections.deque(maxlen=RECENT)  # (text, arrival)
        self.recent_set: collections.Counter[str] = collections.Counter()
        self.since = time.time()  # record lines older than this process are not this driver's to copy
        # record lines up to here may have arrived and been forgotten (a line arrives after it was recorded,
        # and the oldest arrivals are forgotten first): only the record's lines after it are judged
        self.horizon = self.since

    def wrote(self, stream: _Watched, text: str) -> None:
        with self.cond:
            self.last_line = time.monotonic()
            lines = (stream._partial + text).split("\n")
            stream._partial = lines.pop()[-65536:]  # what follows the last newline (a huge unended line: its end)
            found = False
            for line in lines:
                if events.MARKER in line:
                    for text in event_texts(line):
                        self._remember(text)
                if _NEEDLE in line:
                    for event in events.parse_events(line):
                        if event.get("event") == events.LOG_END and isinstance(event.get("rank"), int):
                            self.ends[event["rank"]] = int(event.get("world_size") or 1)
                            found = True
            if found:
                self.cond.notify_all()

    def _remember(self, text: str) -> None:
        if len(self.recent) == self.recent.maxlen:
            old, arrived = self.recent[0]
            self.horizon = max(self.horizon, arrived)
            self.recent_set[old] -= 1
            if self.recent_set[old] <= 0:
                del self.recent_set[old]
        self.recent.append((text, time.time()))
        self.recent_set[text] += 1

    def seen_text(self, text: str) -> bool:
        with self.cond:
            return text in self.recent_set

    def missing(self) -> list[int]:
        """The ranks whose ``log_end`` has not arrived, of the world rank 0's says (all unknown: [0])."""
        world = self.ends.get(0)
        if world is None:
            return [0]
        return [r for r in range(world) if self.ends.get(r) != world]


SEEN = Seen()


def event_texts(line: str) -> list[str]:
    """Each ``@@raytrain {json}`` on a line, as text (Ray's prefix off; two joined events apart)."""
    parts = line.split(events.MARKER)[1:]
    return [events.MARKER + part.rstrip() for part in parts if part.strip()]


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
    copied = replay(record_folder())
    count = sum(copied.values())
    if missing:
        why = f"within {drain_s:g} s" if time.monotonic() >= deadline else f"(no line came for {quiet_s:g} s)"
        from_record = f"; {count} of their events were copied here from the run's record" if count else ""
        said = (f"the last lines of rank(s) {', '.join(map(str, missing))} did not reach the job's log {why} after "
                f"training ended{from_record}")
    elif count:
        said = (f"{count} event(s) of rank(s) {', '.join(map(str, sorted(copied)))} never reached the job's log "
                "(Ray's log forwarding lost them): copied here from the run's record")
    else:
        return missing
    print(f"raytrain: warning: {said}; each rank's own log has every line: raytrain jobs logs JOB --rank N",
          file=sys.stderr, flush=True)
    return missing


def record_folder() -> Path | None:
    """The run's record folder (where this driver records its own events), None where the run keeps none."""
    path = events.recording()
    return Path(path).parent if path else None


def replay(folder: Path | None) -> dict[int, int]:
    """Print every event a rank recorded (``events-rank-N.log``) since this driver started that the log never
    got, in the rank's order, and return how many were copied per rank (ranks with none left out). Only each
    record's last ``REPLAY_MAX`` lines are read, and only lines after ``SEEN.horizon``."""
    if folder is None or not folder.is_dir():
        return {}
    after = SEEN.horizon  # this driver's start, or later once it forgot lines
    copied: dict[int, int] = {}
    for path in sorted(folder.glob("events-rank-*.log")):
        try:
            rank = int(path.stem.removeprefix("events-rank-"))
            lines = _tail_lines(path, REPLAY_MAX)
        except (OSError, ValueError):
            continue
        lost: list[str] = []
        for line in lines:
            stamp, _, rest = line.partition(" ")
            try:
                if float(stamp) <= after:
                    continue
            except ValueError:
                continue
            texts = event_texts(rest)
            if texts and not all(SEEN.seen_text(t) for t in texts):
                lost.append(rest)
        for rest in lost:
            sys.stdout.write(f"(rank {rank}, from the run's record) {rest}\n")
        sys.stdout.flush()
        if lost:
            copied[rank] = len(lost)
    return copied


def _tail_lines(path: Path, count: int, line_bytes: int = 4096) -> list[str]:
    """The last ``count`` whole lines of ``path``, reading no more than about ``count * line_bytes`` of its end
    (a run of days records millions of lines)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = max(0, size - count * line_bytes)
        f.seek(start)
        data = f.read()
    lines = data.decode(errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # began mid-line
    return lines[-count:]
