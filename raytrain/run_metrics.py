"""A run's metrics as a table, reduced from its event lines (the run's record or the job's log): one row per
reported step (the latest report of a step wins, so a restart that repeats steps leaves one row each), with
every rank's peak memory as last reported by then. `jobs metrics|plot|compare` read it."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from raytrain import events

MEMORY_PREFIX = "mem_peak_rank"


@dataclass
class RunMetrics:
    job_id: str
    steps: list[dict] = field(default_factory=list)
    memory: dict[int, float] = field(default_factory=dict)  # rank -> final peak (bytes)
    memory_source: str = "rss"  # "gpu": NVML peaks; "rss": CPU workers' resident memory
    estimate: dict | None = None
    restarts: int = 0
    state: str = ""

    def column(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) where ``key`` is a number."""
        pairs = [(r["step"], r[key]) for r in self.steps if isinstance(r.get(key), (int, float))]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def ranks(self) -> list[int]:
        return sorted(self.memory)

    def to_dict(self) -> dict:
        return {
            "id": self.job_id,
            "steps": self.steps,
            "memory": {str(r): v for r, v in sorted(self.memory.items())},
            "memory_source": self.memory_source,
            "estimate": self.estimate,
            "restarts": self.restarts,
        }

    def to_csv(self) -> str:
        columns: list[str] = ["step"]
        for row in self.steps:
            columns += [k for k in row if k not in columns]
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.steps)
        return out.getvalue()


def _peak(event: dict) -> tuple[str, float] | None:
    if event.get("gpu_memory_peak"):
        return "gpu", float(event["gpu_memory_peak"])
    if event.get("rss_peak"):
        return "rss", float(event["rss_peak"])
    return None


def from_lines(job_id: str, lines: list[str]) -> RunMetrics:
    facts = events.JobFacts()
    run = RunMetrics(job_id)
    by_step: dict[int, dict] = {}
    current: dict[int, float] = {}
    for event, text in (e for line in lines for e in events.parse_events_with_text(line)):
        before = (len(facts.metrics), len(facts.memory), facts.restarts)
        facts.add(event, text)
        kind = event.get("event")
        if kind == events.MEMORY and (peak := _peak(event)):
            run.memory_source = peak[0] if peak[0] == "gpu" else run.memory_source
            rank = int(event.get("rank", 0))
            current[rank] = peak[1]
            run.memory[rank] = max(run.memory.get(rank, 0.0), peak[1])
        elif kind == events.METRICS and len(facts.metrics) > before[0] and isinstance(event.get("step"), (int, float)):
            row = {k: v for k, v in event.items() if k != "event"}
            row["step"] = int(row["step"])
            row.update({f"{MEMORY_PREFIX}{r}": v for r, v in sorted(current.items())})
            by_step[row["step"]] = row
    run.steps = [by_step[s] for s in sorted(by_step)]
    run.estimate = facts.estimate
    run.restarts = facts.restarts
    run.state = "succeeded" if facts.finished else "failed" if facts.error else ""
    return run
