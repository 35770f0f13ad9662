"""Where the time goes from the command's start to step 1: named phases, kept as events in the job's log.

Every side marks the phases it sees with a wall-clock time: the client (command start, request built,
submitted; carried to the driver in ``$RAYTRAIN_CLIENT_TIMINGS``), the driver, Ray Train's controller
(the worker group, preflight, the process group) and every worker (process start, imports, engine, first
step). ``timeline`` reduces them, with the Ray job's own acceptance time, to one ordered table that
``jobs status --timings`` and the benchmarks print. Stdlib only: the CLI, the driver and the workers use it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from raytrain import settings

ENV = "RAYTRAIN_CLIENT_TIMINGS"

# (phase, who marks it, what it means), in the order a submission passes them.
PHASES: list[tuple[str, str, str]] = [
    ("command", "client", "the raytrain command started"),
    ("request_built", "client", "options resolved, request built (dry run)"),
    ("submitted", "client", "cluster ready and checked; request sent"),
    ("job_accepted", "ray", "the Ray job was created"),
    ("driver_started", "driver", "the driver process started (runtime env ready)"),
    ("prestart", "driver", "the controller's and workers' processes asked of the node ahead of the trainer"),
    ("data_ready", "driver", "--data streaming: its first rows read and preprocessed by Ray Data"),
    ("driver_ready", "driver", "driver imports, ray.init, cluster checks and the trainer done"),
    ("workers_started", "controller", "placement group ready, worker processes up"),
    ("preflight", "controller", "every worker can reach rank 0"),
    ("process_group", "controller", "torch.distributed process group formed"),
    ("worker_process", "worker", "a worker process started"),
    ("early_imports", "worker", "torch and deepspeed imported in the background, from the process start"),
    ("train_fn", "worker", "the train function started on a worker"),
    ("imports", "worker", "torch and deepspeed imported"),
    ("engine_built", "worker", "DeepSpeed engine built (and restored)"),
    ("first_step", "worker", "step 1 reported"),
]
ORDER = {name: i for i, (name, _, _) in enumerate(PHASES)}
MEANING = {name: meaning for name, _, meaning in PHASES}


def process_started_since_boot(pid: int | str = "self") -> float | None:
    """Seconds from boot to a process's start (Linux /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_start_time(pid: int | str = "self") -> float | None:
    """Wall-clock start of a process (Linux /proc), or None where that cannot be read."""
    since_boot = process_started_since_boot(pid)
    if since_boot is None:
        return None
    # now, less how long ago it started on the boot clock: /proc/stat's btime is whole seconds (a start put up
    # to 1 s early) and moves when the wall clock is stepped
    try:
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (AttributeError, OSError):
        return None


# The client's marks in this process (the CLI marks "command"; api marks the rest).
_client: dict[str, float] = {}


def mark(phase: str, t: float | None = None) -> None:
    """Record a client-side phase (the first mark of a phase wins)."""
    _client.setdefault(phase, round(t if t is not None else time.time(), 3))


def client_marks() -> dict[str, float]:
    return dict(_client)


def client_env() -> dict[str, str]:
    """The env var that carries this process's marks to the driver."""
    return {ENV: json.dumps(_client, separators=(",", ":"))} if _client else {}


def from_env() -> dict[str, float]:
    """The client's marks, read by the driver."""
    try:
        data = json.loads(settings.raw(ENV) or "{}")
    except ValueError:
        return {}
    return {k: float(v) for k, v in data.items() if k in ORDER and isinstance(v, (int, float))}


@dataclass
class Row:
    phase: str
    at_s: float  # seconds from the first phase seen
    took_s: float  # seconds since the latest earlier phase (0 when it overlapped them)
    t: float  # wall clock (the latest rank's, for per-worker phases)
    ranks: int = 0  # how many workers marked it (per-worker phases)
    spread_s: float = 0.0  # first to last worker
    cpu_s: float | None = None  # CPU seconds the marking process had used by then (the most of any rank)
    cores: dict[int, list[int]] | None = None  # rank -> the cores its training thread is bound to (core_binding)

    @property
    def meaning(self) -> str:
        return MEANING.get(self.phase, "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "meaning": self.meaning}


def timeline(events: Iterable[dict], job_accepted: float | None = None) -> list[Row]:
    """One row per phase seen, in submission order. Per-worker phases keep the latest worker (the one
    every collective waits for) and the spread; a phase restarted after a failure keeps its first run."""
    firsts: dict[str, float] = {}
    per_rank: dict[str, dict[int, float]] = {}
    cpu: dict[str, float] = {}
    cores: dict[str, dict[int, list[int]]] = {}
    for e in events:
        phase, t = e.get("phase"), e.get("t")
        if phase not in ORDER or not isinstance(t, (int, float)):
            continue
        if e.get("rank") is None:
            seen = phase in firsts
            firsts.setdefault(phase, float(t))
        else:
            seen = int(e["rank"]) in per_rank.get(phase, {})
            per_rank.setdefault(phase, {}).setdefault(int(e["rank"]), float(t))
        if not seen and isinstance(e.get("cpu"), (int, float)):
            cpu[phase] = max(cpu.get(phase, 0.0), float(e["cpu"]))
        if not seen and e.get("rank") is not None and isinstance(e.get("cores"), list):
            cores.setdefault(phase, {})[int(e["rank"])] = [int(c) for c in e["cores"]]
    if job_accepted and "job_accepted" not in firsts:
        firsts["job_accepted"] = float(job_accepted)
    points = [(phase, t, 0, 0.0) for phase, t in firsts.items()]
    points += [(phase, max(ts.values()), len(ts), max(ts.values()) - min(ts.values()))
               for phase, ts in per_rank.items()]
    points.sort(key=lambda p: ORDER[p[0]])
    if not points:
        return []
    start = min(p[1] for p in points)
    rows, prev = [], start
    for phase, t, ranks, spread in points:
        rows.append(Row(phase, round(t - start, 3), round(max(t - prev, 0.0), 3), round(t, 3), ranks, round(spread, 3),
                        cpu.get(phase), dict(sorted(cores[phase].items())) if phase in cores else None))
        prev = max(prev, t)
    return rows


def emit(phase: str, t: float | None = None, rank: int | None = None, **detail: Any) -> None:
    """Write the phase into the job's log (from the driver, the controller or a worker); a phase marked now
    carries the CPU seconds this process has used (``cpu``: comparable where wall time is not, on a busy node).
    ``detail``: more fields for the event (e.g. how many processes a phase asked for)."""
    from raytrain import events

    data: dict[str, Any] = {**detail, "phase": phase, "t": round(t if t is not None else time.time(), 3)}
    if t is None:
        data["cpu"] = round(time.process_time(), 3)
    if rank is not None:
        data["rank"] = rank
    events.emit(events.TIMING, **data)


def table(rows: list[Row]) -> list[str]:
    """Plain-text lines for the terminal: phase, seconds from the start, seconds it added, what it is."""
    lines = [f"{'phase':<16} {'at':>8} {'took':>7} {'cpu':>7}  what"]
    for r in rows:
        extra = f" ({r.ranks} workers, spread {r.spread_s:.2f} s)" if r.ranks > 1 else ""
        if r.cores:  # "; training threads on cores 0 | 1": rank by rank
            extra += "; training thread" + ("s" if len(r.cores) > 1 else "") + " on cores " + " | ".join(
                ",".join(map(str, cs)) for cs in r.cores.values())
        cpu = f"{r.cpu_s:>6.2f}s" if r.cpu_s is not None else f"{'':>7}"
        lines.append(f"{r.phase:<16} {r.at_s:>7.2f}s {r.took_s:>6.2f}s {cpu}  {r.meaning}{extra}")
    return lines
