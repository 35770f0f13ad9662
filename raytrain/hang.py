"""The hang watchdog's decisions and the stack summary (pure: no Ray, no torch; the driver's watchdog, the
board and `raytrain jobs stack` use them).

A job is hung when no rank has finished a step for the hang timeout: ``--hang-timeout``, or by default the
larger of 10 x the median step time and 120 s. The watchdog is armed once a rank has finished a step of the
current worker group (start-up has ``--start-timeout`` and the process-group ``--timeout``).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

DEFAULT_FLOOR_S = 120.0
STEP_MULTIPLE = 10.0
# After the collective timeout a collective raises on its own; --on-hang report fails the job itself this much
# later when none did (ranks stuck outside any collective).
FAIL_GRACE_S = 30.0

# A frame from one of these is inside a collective (torch.distributed, DeepSpeed's comm wrappers).
COLLECTIVE_PATHS = (f"torch{os.sep}distributed{os.sep}", f"deepspeed{os.sep}comm{os.sep}")
# Frames of these are not where the job "is": the summary names the job's innermost frame that called them.
LIBRARY_PATHS = (f"{os.sep}torch{os.sep}", f"{os.sep}deepspeed{os.sep}", f"{os.sep}ray{os.sep}",
                 os.path.dirname(os.path.abspath(__file__)) + os.sep,  # raytrain itself
                 f"{os.sep}site-packages{os.sep}raytrain{os.sep}", os.path.dirname(os.__file__) + os.sep)  # stdlib


def hang_timeout(option: float | None, median_step_s: float | None) -> float | None:
    """Seconds without a finished step that make a hang; None: the watchdog is off (``--hang-timeout 0``)."""
    if option is not None:
        return float(option) if option > 0 else None
    return max(STEP_MULTIPLE * median_step_s, DEFAULT_FLOOR_S) if median_step_s else DEFAULT_FLOOR_S


def median_step(beats: Iterable[dict]) -> float | None:
    """The slowest rank's median step time (s) among the beats, or None before two steps."""
    medians = [b["median_step_s"] for b in beats if isinstance(b.get("median_step_s"), (int, float))]
    return max(medians) if medians else None


def idle_for(now: float, beats: Iterable[dict]) -> float | None:
    """Seconds since any rank last finished a step; None before the first (the watchdog is not armed)."""
    done = [b["step_done"] for b in beats if isinstance(b.get("step_done"), (int, float))]
    return now - max(done) if done else None


def decide(now: float, beats: list[dict], *, option: float | None, on_hang: str, collective_timeout_s: float,
           reported: bool) -> tuple[str | None, float | None, float | None]:
    """(action, idle seconds, timeout): action None (nothing to do), "report" (a new hang: capture and report),
    "restart" or "fail". ``reported``: this hang was already reported."""
    timeout = hang_timeout(option, median_step(beats))
    idle = idle_for(now, beats)
    if timeout is None or idle is None or idle < timeout:
        return None, idle, timeout
    if on_hang == "restart":
        return "restart", idle, timeout
    if on_hang == "fail":
        return "fail", idle, timeout
    if not reported:
        return "report", idle, timeout
    if idle >= max(collective_timeout_s, timeout) + FAIL_GRACE_S:
        return "fail", idle, timeout
    return None, idle, timeout


def _where(frame: dict) -> str:
    return f"{frame['function']} ({os.path.basename(frame['file'])}:{frame['line']})"


def _is(frame: dict, paths: tuple[str, ...]) -> bool:
    return any(p in frame.get("file", "") for p in paths)


def training_thread(threads: list[dict]) -> dict | None:
    for thread in threads:
        if thread.get("training"):
            return thread
    return None


def summarize_rank(report: dict, now: float) -> dict[str, Any]:
    """One rank's stack report -> {rank, node, step, phase, collective (its function, or None), where (the
    job's innermost frame: "function (file:line)"), file, line, function, for_s (since its last step)}."""
    thread = training_thread(report.get("threads") or [])
    frames = (thread or {}).get("frames") or []
    collective_frames = [f for f in frames if _is(f, COLLECTIVE_PATHS)]
    own = [f for f in frames if not _is(f, LIBRARY_PATHS)]
    innermost = own[-1] if own else (frames[-1] if frames else None)
    since = report.get("step_done") or report.get("phase_since")
    return {
        "rank": report.get("rank"), "node": report.get("node"), "step": report.get("step"),
        "phase": "collective" if collective_frames else report.get("phase"),
        "collective": collective_frames[-1]["function"] if collective_frames else None,
        "where": _where(innermost) if innermost else None,
        "file": innermost["file"] if innermost else None, "line": innermost["line"] if innermost else None,
        "function": innermost["function"] if innermost else None,
        "for_s": round(now - since, 1) if isinstance(since, (int, float)) else None,
        "no_training_thread": thread is None,
    }


def describe_rank(s: dict) -> str:
    """One line per rank, e.g. ``rank 1 (10.0.0.2): not in a collective: in stuck (job.py:23) for 45 s``."""
    head = f"rank {s['rank']}" + (f" ({s['node']})" if s.get("node") else "")
    for_s = f" for {s['for_s']:.0f} s" if isinstance(s.get("for_s"), (int, float)) else ""
    step = f", after step {s['step']}" if s.get("step") is not None else ""
    if s.get("collective"):
        return f"{head}: waiting in a collective ({s['collective']}) called from {s['where']}{for_s}{step}"
    if s.get("no_training_thread"):
        return f"{head}: no training thread (phase {s.get('phase')}){step}"
    return f"{head}: not in a collective: in {s['where']}{for_s} (phase {s.get('phase')}){step}"


def summarize(reports: dict[int, dict], now: float, world_size: int | None = None) -> list[dict]:
    """Every rank's summary, in rank order; a rank that gave no stack is named as such."""
    ranks = sorted(set(reports) | set(range(world_size or 0)))
    out = []
    for rank in ranks:
        if rank in reports:
            out.append(summarize_rank(reports[rank], now))
        else:
            out.append({"rank": rank, "missing": True})
    return out


def lines(summary: list[dict]) -> list[str]:
    return [f"rank {s['rank']}: gave no stack (its process did not answer)" if s.get("missing") else describe_rank(s)
            for s in summary]


def format_stack(report: dict) -> list[str]:
    """A rank's full stacks as text, py-spy-dump style: each thread, innermost frame first."""
    out = [f"rank {report.get('rank')} (pid {report.get('pid')}, {report.get('node')}): step {report.get('step')}, "
           f"phase {report.get('phase')}"]
    for thread in report.get("threads") or []:
        mark = " (training)" if thread.get("training") else ""
        out.append(f"  thread {thread.get('thread')}{mark}:")
        for frame in reversed(thread.get("frames") or []):
            out.append(f"    {frame['function']} ({frame['file']}:{frame['line']})")
    return out
