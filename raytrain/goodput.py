"""Goodput: the share of a run's wall time (since its first reported step) spent in steps that counted, and
where the rest went, from the job's event log alone (``JobFacts``).

The timeline from the first step's report to the end (the run's end, or now) is cut at every step report;
each piece goes to exactly one part, so the parts add up to the wall time:

- ``steps``: the time of steps whose result counted (no later report redid them);
- ``checkpoint``: what the steps paid for checkpoints (``checkpoint_stall`` events);
- ``data``: waits for ``ctx.dataset``'s next batch (the reports' ``data_wait_s``);
- ``lost``: steps redone after a failure (their first run), and from the last report before a failure to
  the restart's announcement (the step in progress, the failure's detection);
- ``restarts``: from a restart's announcement to the new group's first step (placement, start-up, restore);
- ``other``: after the last report (the step in progress, the final save and shutdown).

Start-up before the first step is not part of the wall time; ``startup_s`` says how long it was where the
log has the driver's start time.
"""
from __future__ import annotations

import threading
import time
from typing import Any

PARTS = ("steps", "checkpoint", "data", "lost", "restarts", "other")


def goodput(facts: Any, *, now: float | None = None, job_start: float | None = None) -> dict[str, Any] | None:
    """{"goodput": fraction, "wall_s", "parts": {part: seconds}, "startup_s"} or None before two reports."""
    reports = sorted((m for m in facts.metrics if isinstance(m.get("wall_time"), (int, float))),
                     key=lambda m: m["wall_time"])
    if not reports:
        return None
    ended = _end_time(facts)
    end = ended if ended is not None else (now if now is not None else time.time())
    end = max(end, reports[-1]["wall_time"])
    stalls = [(float(s["time"]), float(s.get("stall_s") or 0.0)) for s in facts.stalls
              if isinstance(s.get("time"), (int, float))]
    restarts = sorted(facts.restart_times)
    parts = dict.fromkeys(PARTS, 0.0)
    # a report counted unless a later report (after a restart) has the same or an earlier step
    counted, lowest = [True] * len(reports), float("inf")
    for i in range(len(reports) - 1, -1, -1):
        step = float(reports[i].get("step") or 0)
        counted[i] = step < lowest
        lowest = min(lowest, step)
    step_s = _typical_step_s(reports)
    for i in range(1, len(reports)):
        a, b, m = reports[i - 1]["wall_time"], reports[i]["wall_time"], reports[i]
        span = b - a
        if span <= 0:
            continue
        steps_done = max(float(m.get("step") or 0) - float(reports[i - 1].get("step") or 0), 1.0)
        restart = next((r for r in restarts if a < r <= b), None)
        if restart is not None:
            stall = min(sum(s for t, s in stalls if a < t <= restart), restart - a)
            parts["checkpoint"] += stall
            parts["lost"] += (restart - a) - stall
            work = min(step_s, b - restart)  # the new group's first step; the rest was its start-up
            parts["steps" if counted[i] else "lost"] += work
            parts["restarts"] += (b - restart) - work
            continue
        stall = min(sum(s for t, s in stalls if a < t <= b), span)
        wait = min(float(m.get("data_wait_s") or 0.0) * steps_done, span - stall)
        parts["checkpoint"] += stall
        parts["data"] += wait
        parts["steps" if counted[i] else "lost"] += span - stall - wait
    last = reports[-1]["wall_time"]
    tail = end - last
    if tail > 0:
        restart = next((r for r in restarts if last < r <= end), None)
        cut = restart if restart is not None else end
        stall = min(sum(s for t, s in stalls if last < t <= cut), cut - last)
        parts["checkpoint"] += stall
        if restart is not None:
            parts["lost"] += (restart - last) - stall
            parts["restarts"] += end - restart
        else:
            parts["other"] += tail - stall
    wall = end - reports[0]["wall_time"]
    out: dict[str, Any] = {
        "goodput": round(parts["steps"] / wall, 4) if wall > 0 else None,
        "wall_s": round(wall, 3),
        "parts": {k: round(v, 3) for k, v in parts.items()},
    }
    if job_start is not None and job_start < reports[0]["wall_time"]:
        out["startup_s"] = round(reports[0]["wall_time"] - job_start, 3)
    return out


def _end_time(facts: Any) -> float | None:
    for event in (facts.finished, facts.error, facts.stopped):
        if event and isinstance(event.get("time"), (int, float)):
            return float(event["time"])
    return None


def _typical_step_s(reports: list[dict]) -> float:
    """The median reported step time (a restarted group's first step is counted as one such step)."""
    times = sorted(float(m["step_time_s"]) for m in reports if isinstance(m.get("step_time_s"), (int, float)))
    return times[len(times) // 2] if times else 0.0


def describe(g: dict[str, Any] | None) -> str:
    """One line: ``goodput 82.0% of 120.5 s: steps 98.8 s, checkpoint 6.1 s, restarts 12.0 s, ...``."""
    if not g or g.get("goodput") is None:
        return ""
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in g["parts"].items() if v >= 0.05)
    start = f" (start-up before it {g['startup_s']:.1f} s)" if g.get("startup_s") is not None else ""
    return f"{g['goodput'] * 100:.1f}% of {g['wall_s']:.1f} s since the first step: {parts}{start}"


class Feed:
    """Rank 0's goodput for --track's trackers: the run's record read once (the steps, restarts and saves
    of earlier worker groups), then this group's reports and saves as they happen; ``update`` gives
    ``{"goodput": fraction}`` at most every ``every_s`` (a report in between gets nothing)."""

    def __init__(self, record_lines: list[str] | None = None, every_s: float = 10.0):
        from raytrain.events import JobFacts

        self.facts = JobFacts.from_lines(record_lines or [])
        self.every_s = every_s
        self._last = -float("inf")
        self._lock = threading.Lock()  # async saves add their commits from the saver's thread
        self._checkpoint: dict[str, float] = {}  # the latest save's costs, for the next report

    def add(self, event: dict) -> None:
        from raytrain import events

        with self._lock:
            self.facts.add(event)
            kind = event.get("event")
            if kind == events.CHECKPOINT_STALL and isinstance(event.get("stall_s"), (int, float)):
                self._checkpoint["checkpoint/stall_s"] = event["stall_s"]
            elif kind == events.CHECKPOINT:
                self._checkpoint.update({f"checkpoint/{k}": event[k] for k in events.TIMING_KEYS
                                         if isinstance(event.get(k), (int, float))})

    def update(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """What the trackers get with this report: a save's costs once (``checkpoint/stall_s``,
        ``checkpoint/snapshot_s``, ``checkpoint/write_s``, ...), the goodput at most every ``every_s``."""
        with self._lock:
            self.facts.add({"event": "metrics", **metrics})
            out, self._checkpoint = self._checkpoint, {}
            now = float(metrics.get("wall_time") or time.time())
            if now - self._last < self.every_s:
                return out
            self._last = now
            g = goodput(self.facts, now=now)
        return {**out, **({"goodput": g["goodput"]} if g and g.get("goodput") is not None else {})}
