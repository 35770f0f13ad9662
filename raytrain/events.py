"""The line protocol between the worker runtime and the control plane.

The runtime prints one JSON object per line after a fixed marker; Ray forwards worker and driver stdout
into the job's log, and the CLI (progress, ``jobs status``, ``jobs logs``) reads the same lines back. A
log is therefore the single record of what a job did.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

MARKER = "@@raytrain "

# Event kinds.
STARTED = "started"  # driver: plan summary, before workers start
CAPACITY = "capacity"  # driver: the cluster cannot hold the request (config error, exit 2)
INVALID = "invalid"  # driver: the plan cannot run on this cluster (e.g. --resume not found; exit 2)
METRICS = "metrics"  # rank 0: step, loss, throughput, user metrics
RESTARTING = "restarting"  # controller: the worker group is restarting after a failure
CHECKPOINT = "checkpoint"  # rank 0: a checkpoint of this step was reported
MEMORY = "memory"  # every rank, every ~10 s and at the end: peak GPU memory (NVML) or RSS
ESTIMATE = "estimate"  # rank 0: the planner's per-GPU memory estimate for this model and config
PREFLIGHT = "preflight"  # controller: where each worker runs and the network interface it uses
RESIZED = "resized"  # rank 0: an elastic job runs with a different number of workers (grad-accum adjusted)
WAITING = "waiting"  # driver: the workers cannot be placed yet; what they wait for and who holds it
PLACED = "placed"  # driver: the workers' placement group is placed (their processes start now)
CLEANED = "cleaned"  # driver or `jobs stop`: placement groups that ended jobs leaked were removed
TIMING = "timing"  # any side: a start-up phase reached (raytrain.timings), with its wall-clock time
TRACKER = "tracker"  # rank 0: a --track tracker was dropped (it could not start or stopped answering): why
RANK_LOG = "rank_log"  # a rank's log copier: the copy to the storage stalled, or its final copy failed
DATASET = "dataset"  # driver: a --data dataset is ready (name, rows after preprocessing)
FINISHED = "finished"  # driver: training returned; final metrics
ERROR = "error"  # driver: training raised; message and exception type
STOPPED = "stopped"  # driver: SIGTERM (`jobs stop`, or its cluster stopping) ends the job
ENGINE = "engine"  # rank 0: what DeepSpeed built (ZeRO stage, offload, tp/pp/dp sizes, batch), read from the engine
HANG = "hang"  # driver: no rank finished a step for the hang timeout; one line per rank (raytrain.hang)
STRAGGLER = "straggler"  # driver: a rank became a straggler (state "slow") or recovered (raytrain.straggler)
STACKS = "stacks"  # `jobs stack`'s utility job: every rank's stacks now
SKIPPED = "skipped"  # rank 0: every rank skipped an optimizer step: a non-finite loss/gradients (runtime.worker.guard)
REFUSED = "checkpoint_refused"  # rank 0: a checkpoint was not written: the weights are non-finite
ROLLBACK = "rollback"  # rank 0: --rollback-after bad steps in a row: back to the last checkpoint, their rows skipped
CHECKPOINT_STALL = "checkpoint_stall"  # rank 0: seconds the step paid for a checkpoint (stall_s), with its time
LOG_END = "log_end"  # every rank, the last line of a train function that returned: the driver waits for them all
PREEMPTED = "preempted"  # the rank that got a preemption notice: the checkpoint it led to (or why none), its save time


def format_event(kind: str, **data: Any) -> str:
    return MARKER + json.dumps({"event": kind, **data}, default=str, separators=(",", ":"))


_record: str | None = None  # a file in the run's storage that keeps this process's events (raytrain.run_record)


def record_to(path: str | None) -> None:
    """Also append every event this process emits to ``path`` (None: stop), each line led by its time."""
    global _record
    _record = path


def recording() -> str | None:
    """The file this process appends its events to (``record_to``), if any."""
    return _record


def emit(kind: str, **data: Any) -> None:
    """Write one event line to stdout. ``sys.stdout.write``, not ``print``: Ray Train v2 patches print."""
    import sys

    line = format_event(kind, **data)
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    finally:  # the record has it even where stdout raised (e.g. a signal handler's write in the middle of one)
        if _record:
            import time

            try:
                with open(_record, "a") as f:
                    f.write(f"{time.time():.6f} {line}\n")
            except OSError:  # the record is a copy: never fail training for it
                pass


def parse_events(line: str) -> list[dict]:
    """Every event on a log line (most hold none or one). Tolerates Ray's ``(RayTrainWorker pid=..)`` prefixes
    and two events on one line: Ray's driver prints a forwarded worker line and its newline as two writes, and
    the driver's own event written between them joins the worker's line."""
    return [event for event, _ in parse_events_with_text(line)]


_DECODER = json.JSONDecoder()


def parse_events_with_text(line: str) -> list[tuple[dict, str]]:
    """``parse_events``, each event with its JSON text as written (what :meth:`JobFacts.add` tells copies by)."""
    found: list[tuple[dict, str]] = []
    idx = line.find(MARKER)
    while idx >= 0:
        start = idx + len(MARKER)
        try:
            event, end = _DECODER.raw_decode(line, start)
        except ValueError:
            event, end = None, start
        if isinstance(event, dict) and "event" in event:
            found.append((event, line[start:end]))
        idx = line.find(MARKER, end)
    return found


def parse_line(line: str) -> dict | None:
    """The first event on a log line, or None (``parse_events`` gives them all)."""
    found = parse_events(line)
    return found[0] if found else None


@dataclass
class JobFacts:
    """What a job's log says about it: the facts status, logs and progress all read."""

    started: dict | None = None
    metrics: list[dict] = field(default_factory=list)
    restarts: int = 0
    restarting: bool = False  # a restart was announced and no step has been reported since
    checkpoints: list[int] = field(default_factory=list)
    memory: dict[int, dict] = field(default_factory=dict)  # rank -> latest memory event
    estimate: dict | None = None
    engine: dict | None = None  # what DeepSpeed built (the latest: each worker-group start builds one)
    preflight: dict | None = None  # the latest (each worker-group start runs one)
    resized: list[dict] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)  # raytrain.timings reduces them
    waiting: dict | None = None  # the workers wait to be placed (message: for what, held by whom)
    cleaned: list[str] = field(default_factory=list)  # leaked placement groups the driver removed
    datasets: dict[str, dict] = field(default_factory=dict)  # --data NAME -> its dataset event
    trackers_dropped: dict[str, str] = field(default_factory=dict)  # --track NAME -> why it was dropped
    rank_logs_lost: dict[int, dict] = field(default_factory=dict)  # rank -> its log copier's copy_failed event
    finished: dict | None = None
    error: dict | None = None
    stopped: dict | None = None
    hang: dict | None = None  # the latest hang event, until a step is reported after it
    stragglers: dict[int, dict] = field(default_factory=dict)  # rank -> its straggler event, until it recovers
    skipped: list[dict] = field(default_factory=list)  # steps the non-finite guard skipped (step, message)
    refused: list[dict] = field(default_factory=list)  # checkpoints not written (non-finite weights)
    rollbacks: list[dict] = field(default_factory=list)  # rollbacks after bad steps in a row (message, rows)
    stalls: list[dict] = field(default_factory=list)  # checkpoint_stall events (step, stall_s, time)
    checkpoint_events: list[dict] = field(default_factory=list)  # each commit: mode, snapshot/write/upload/wait s
    preempted: list[dict] = field(default_factory=list)  # preemption notices acted on (message, saved, save_s)
    restart_times: list[float] = field(default_factory=list)  # when each restart was announced (goodput)

    _seen: set = field(default_factory=set, repr=False)

    def add(self, event: dict, text: str | None = None) -> None:
        """``text``: the event's JSON as written (``parse_events_with_text``): a copy of a line has the same text,
        and comparing it costs a fraction of serialising the event again (a long run's log has millions)."""
        key = text if text is not None else json.dumps(event, sort_keys=True, default=str)
        if key in self._seen:  # the same line reached the log twice (stdout and stderr copies)
            return
        self._seen.add(key)
        kind = event.get("event")
        if kind in (PLACED, PREFLIGHT, METRICS, FINISHED, ERROR, CAPACITY, INVALID):
            self.waiting = None
        if kind == STARTED:
            self.started = event
        elif kind == WAITING:
            self.waiting = event
        elif kind == CLEANED:
            self.cleaned.extend(event.get("groups") or [])
        elif kind == METRICS:
            self.metrics.append(event)
            self.restarting = False
            self.hang = None
        elif kind == RESTARTING:
            self.restarts += 1
            self.restarting = True
            if isinstance(event.get("time"), (int, float)):
                self.restart_times.append(float(event["time"]))
        elif kind == MEMORY:
            self.memory[int(event.get("rank", 0))] = event
        elif kind == ESTIMATE:
            self.estimate = event
        elif kind == ENGINE:
            self.engine = event
        elif kind == CHECKPOINT:
            # in step order (a job's commits are): one whose line Ray lost mid-run is copied from the run's record
            # at the end of the job (runtime.driver.log_drain)
            at = _step_position(self.checkpoints, event.get("step"))
            self.checkpoints.insert(at, event.get("step"))
            self.checkpoint_events.insert(at, event)
        elif kind == PREFLIGHT:
            self.preflight = event
        elif kind == RESIZED:
            self.resized.append(event)
        elif kind == TIMING:
            self.timings.append(event)
        elif kind == TRACKER and event.get("state") == "dropped":
            self.trackers_dropped[str(event.get("name"))] = str(event.get("reason", ""))
        elif kind == RANK_LOG and event.get("state") == "copy_failed":
            self.rank_logs_lost[int(event.get("rank", 0))] = event
        elif kind == DATASET:
            self.datasets[str(event.get("name"))] = event
        elif kind == FINISHED:
            self.finished = event
        elif kind in (ERROR, CAPACITY, INVALID):
            self.error = event
        elif kind == STOPPED:
            self.stopped = event
        elif kind == HANG:
            self.hang = event
        elif kind == STRAGGLER:
            if event.get("state") == "slow":
                self.stragglers[int(event.get("rank", 0))] = event
            else:
                self.stragglers.pop(int(event.get("rank", 0)), None)
        elif kind == SKIPPED:
            self.skipped.append(event)
        elif kind == REFUSED:
            self.refused.append(event)
        elif kind == ROLLBACK:
            self.rollbacks.append(event)
        elif kind == CHECKPOINT_STALL:
            self.stalls.append(event)
        elif kind == PREEMPTED:
            self.preempted.append(event)

    def warnings(self) -> list[str]:
        """A hang's line per rank (until a step is reported after it); a straggler's line (until it recovers);
        what the job's workers could not measure or keep: a memory sampler that failed (its peaks stop there), a
        tracker that was dropped (its run stops there), a rank log the storage did not take."""
        hung = [f"hung: no step finished for {self.hang.get('idle_s', 0):.0f} s ({self.hang.get('action')}): {line}"
                for line in self.hang.get("lines") or []] if self.hang else []
        slow = [f"straggler: {e.get('message')}" for _, e in sorted(self.stragglers.items())]
        return hung + slow + [
            f"memory sampler failed on rank {rank}: {m['sampler_error']} (memory peaks cover the samples before it)"
            for rank, m in sorted(self.memory.items()) if m.get("sampler_error")
        ] + [f"--track {name} was dropped: {why}" for name, why in sorted(self.trackers_dropped.items())] + [
            f"rank {rank}'s log could not be copied to {e.get('log')} ({e.get('reason')}); it stays on its node at "
            f"{e.get('local')}" for rank, e in sorted(self.rank_logs_lost.items())
        ]

    @property
    def last_metrics(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    def peak_memory(self) -> tuple[str, int] | None:
        """("gpu" | "rss", the largest peak over all workers in bytes), or None before any sample."""
        gpu = [m["gpu_memory_peak"] for m in self.memory.values() if m.get("gpu_memory_peak")]
        if gpu:
            return "gpu", max(gpu)
        rss = [m["rss_peak"] for m in self.memory.values() if m.get("rss_peak")]
        return ("rss", max(rss)) if rss else None

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics if isinstance(m.get("loss"), (int, float))]

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> "JobFacts":
        facts = cls()
        for line in lines:
            for event, text in parse_events_with_text(line):
                facts.add(event, text)
        return facts


def _step_position(steps: list, step) -> int:
    """Where ``step`` goes in ``steps`` to keep the integer steps in order: after every step not above it (at the
    end where either is not an integer)."""
    at = len(steps)
    while at and isinstance(step, int) and isinstance(steps[at - 1], int) and steps[at - 1] > step:
        at -= 1
    return at


TIMING_KEYS = ("snapshot_s", "write_s", "upload_s", "wait_s")


def checkpoint_timings(facts: JobFacts) -> list[dict]:
    """Each committed checkpoint's costs: ``step``, ``mode``, ``stall_s`` (what the training step paid: the
    ``checkpoint_stall`` of its step, or a sync save's own), and in async mode the snapshot, the background
    write and upload, and the wait for the save before it."""
    stalls = {e.get("step"): e.get("stall_s") for e in facts.stalls}
    out = []
    for e in facts.checkpoint_events:
        row = {"step": e.get("step"), "mode": e.get("mode"), "stall_s": stalls.get(e.get("step"), e.get("stall_s"))}
        row.update({k: e[k] for k in TIMING_KEYS if e.get(k) is not None})
        out.append(row)
    return out


def describe_checkpoint(row: dict) -> str:
    """``step 12 (async): stall 0.11 s; snapshot 0.06 s, write 0.80 s, upload 0.10 s``."""
    costs = [f"{k[:-2]} {row[k]:.2f} s" for k in TIMING_KEYS if isinstance(row.get(k), (int, float))]
    stall = f"stall {row['stall_s']:.2f} s" if isinstance(row.get("stall_s"), (int, float)) else "stall unknown"
    mode = f" ({row['mode']})" if row.get("mode") else ""
    return f"step {row.get('step')}{mode}: {stall}" + (f"; {', '.join(costs)}" if costs else "")
