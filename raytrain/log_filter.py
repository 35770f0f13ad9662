"""What of a job's log reaches the user's terminal: the job's own output and raytrain's lines, without Ray's
INFO chatter, Ray-internal warnings that need no action, and ANSI colour codes where the output is not a
terminal (or ``NO_COLOR`` is set). ``-v`` turns the filter off."""
from __future__ import annotations

import os
import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's logging format: "YYYY-MM-DD hh:mm:ss,mmm\tINFO job_manager.py:581 -- Runtime env is setting up."
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO)\s+\S+\.py:\d+ -- ")
# A Ray actor/worker prefix: "(RayTrainWorker pid=123)" or "(TrainController pid=9, ip=10.0.0.1)".
PREFIX = re.compile(r"^(\((?:[\w.]+ )?pid=[^)]*\)|\(raylet[^)]*\)) ?")

# Lines Ray writes that ask nothing of the user (matched on the line without its prefix).
NOISE = (
    "Reporting training result ",  # Ray Train, each ray.train.report at INFO: the progress line says it better
    "Running entrypoint for job ",  # the Jobs API's header; raytrain already said it submitted the job
    # DeepSpeed on rank 0 for any optimizer outside its short list (SGD included) once raytrain has allowed it
    # (zero_allow_untested_optimizer): nothing to act on
    "You are using ZeRO with an untested optimizer, proceed with caution",
)
NOISE_PATTERNS = (
    # core_worker.cc, when Ray Train kills its preemption watcher (an actor with max_restarts > 0)
    re.compile(r"core_worker\.cc.*(PreemptionWatcher|max_restarts)"),
    # Ray Train's autoscaling coordinator on a busy machine: "safe to ignore" (its own words), then a traceback
    re.compile(r"Failed to send resource request for train-"),
    # Ray Train's controller after a worker died: "expected" (its own word), then a traceback; raytrain's
    # "workers restarting: ..." line says what happened
    re.compile(r"^Graceful shutdown of backend failed\. This is expected"),
    # the raylet's generic line for the same death
    re.compile(r"^A worker died or was killed while executing a task by an unexpected system error"),
)
TRACEBACK_BODY = re.compile(r"^(\s|Traceback |\^|[\w.]+(Error|Exception|Timeout)\b)")


def split_prefix(line: str) -> tuple[str, str]:
    """A log line without ANSI codes, as (Ray's ``(pid=..)`` prefix or "", the rest)."""
    plain = ANSI.sub("", line)
    match = PREFIX.match(plain)
    return (match.group(1), plain[match.end():]) if match else ("", plain)


def wants_color(is_terminal: bool) -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set (https://no-color.org)."""
    return is_terminal and not os.environ.get("NO_COLOR")


class LogFilter:
    """Feed it one log line at a time; it returns the line to show, or None. Stateful: a noise line's
    traceback (the lines after it with the same process prefix) is dropped with it."""

    def __init__(self, *, color: bool, verbose: bool = False):
        self.color = color
        self.verbose = verbose
        self._noise_prefix: str | None = None

    def __call__(self, line: str) -> str | None:
        if not self.color:
            line = ANSI.sub("", line)
        if self.verbose:
            return line
        prefix, body = split_prefix(line)
        if self._noise_prefix is not None:
            # the rest of a noise block: a traceback, or (from Ray's own actors) everything it adds until
            # raytrain's next event line
            same = prefix == self._noise_prefix
            if same and (TRACEBACK_BODY.match(body) or (prefix and "@@raytrain " not in body)):
                return None
            self._noise_prefix = None
        if RAY_LOG_LINE.match(body) or any(n in body for n in NOISE):
            return None
        if any(p.search(body) for p in NOISE_PATTERNS):
            self._noise_prefix = prefix
            return None
        return line
