"""Job states, as Ray Train v2's controller names them, derived from Ray's job status and the job log."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from raytrain.events import JobFacts


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)

    def __str__(self) -> str:
        return self.value


_FROM_RAY = {
    "PENDING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPED": JobState.STOPPED,
}


def state_of(ray_status: str, facts: JobFacts | None = None) -> JobState:
    """Ray's job status refined by the log: a running job whose workers restart is RESTARTING."""
    state = _FROM_RAY.get(str(ray_status).split(".")[-1].upper(), JobState.PENDING)
    if state is JobState.RUNNING and facts is not None:
        if facts.restarting:
            return JobState.RESTARTING
        if facts.started is None:
            return JobState.PENDING  # the driver has not placed its workers yet
    return state


@dataclass
class JobInfo:
    """One job as any target reports it."""

    job_id: str
    name: str
    state: JobState
    target: str
    address: str
    entrypoint: str = ""
    message: str = ""
    start_time: float | None = None  # seconds since the epoch
    end_time: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    facts: JobFacts | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "id": self.job_id,
            "name": self.name,
            "state": self.state.value,
            "target": self.target,
            "address": self.address,
            "entrypoint": self.entrypoint,
            "message": self.message,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "metadata": self.metadata,
        }
        if self.facts is not None:
            out["restarts"] = self.facts.restarts
            out["last_metrics"] = self.facts.last_metrics
            out["final"] = self.facts.finished
            out["error"] = self.facts.error
            out["checkpoints"] = self.facts.checkpoints
            out["memory"] = {str(rank): event for rank, event in sorted(self.facts.memory.items())}
            out["estimate"] = self.facts.estimate
            out["preflight"] = self.facts.preflight
            out["resized"] = self.facts.resized
        return out
