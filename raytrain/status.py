"""Job states, as Ray Train v2's controller names them: the one mapping from what a cluster says about a job
(Ray's job status, a KubeRay RayJob's status) and what its log says (events) to a job state."""
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


def ray_job_state(ray_status: str) -> JobState:
    """The Ray Jobs API's status (PENDING, RUNNING, ...) as a JobState, before the log is read."""
    return _FROM_RAY.get(str(ray_status).split(".")[-1].upper(), JobState.PENDING)


def rayjob_state(status: dict[str, Any] | None) -> JobState:
    """KubeRay's two RayJob status fields -> one JobState, before the log is read. Ray's job status wins once
    it is terminal."""
    status = status or {}
    deployment = status.get("jobDeploymentStatus") or ""
    job = str(status.get("jobStatus") or "").upper()
    if deployment in ("Suspending", "Suspended"):
        return JobState.STOPPED
    if deployment == "ValidationFailed":
        return JobState.FAILED
    if job in ("SUCCEEDED", "FAILED", "STOPPED"):
        return JobState(job.lower())
    if deployment == "Failed":
        return JobState.FAILED
    if deployment == "Complete":
        return JobState.SUCCEEDED
    if deployment == "Retrying":
        return JobState.RESTARTING
    if job == "RUNNING":
        return JobState.RUNNING
    return JobState.PENDING


def outcome(facts: JobFacts | None) -> JobState | None:
    """How the job ended by its driver's last word: ``finished`` SUCCEEDED, ``error``/``capacity``/``invalid``
    FAILED, ``stopped`` STOPPED; None: no last word (yet). The one reading of it, for status and the record."""
    if facts is None:
        return None
    if facts.finished is not None:
        return JobState.SUCCEEDED
    if facts.error is not None:
        return JobState.FAILED
    if facts.stopped is not None:
        return JobState.STOPPED
    return None


def job_state(cluster_state: JobState, facts: JobFacts | None = None) -> JobState:
    """The cluster's view refined by the job's log, the same for every target: a running job whose driver has
    said it failed (its last word before it exits: ``outcome``) is FAILED; one whose workers restart is
    RESTARTING; one whose driver was ended by a SIGTERM other than Ray's job stop (Ray says FAILED) is STOPPED;
    one whose workers are not placed yet (the driver has not asked, or their placement group waits
    for resources: ``facts.waiting``) is PENDING. A success or a stop waits for the cluster to say so.
    ``facts`` None: the log was not read (or could not be), so the cluster's view stands."""
    if cluster_state is JobState.RUNNING and facts is not None:
        if outcome(facts) is JobState.FAILED:  # the driver's last word (it exits next): not running any more
            return JobState.FAILED
        if facts.restarting:
            return JobState.RESTARTING
        if facts.started is None or facts.waiting is not None:
            return JobState.PENDING  # the workers are not placed yet
    if cluster_state is JobState.FAILED and outcome(facts) is JobState.STOPPED:
        return JobState.STOPPED  # a SIGTERM that was not Ray's job stop: the driver ends by the signal it got
    return cluster_state


def state_of(ray_status: str, facts: JobFacts | None = None) -> JobState:
    """Ray's job status refined by the log (``job_state(ray_job_state(...), facts)``)."""
    return job_state(ray_job_state(ray_status), facts)


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
    problems: list[str] = field(default_factory=list)  # what could not be read (the job's log on Kubernetes)
    ray_job_id: str = ""  # Ray's id of the job's driver (e.g. 03000000): its actors and placement groups carry it

    def warnings(self) -> list[str]:
        """What the status could not see or the job could not measure: shown by `jobs status`."""
        return [*self.problems, *(self.facts.warnings() if self.facts else [])]

    def goodput(self) -> dict[str, Any] | None:
        """raytrain.goodput of the job so far (to its end once it ended)."""
        if self.facts is None:
            return None
        from raytrain import goodput

        now = self.end_time if self.state.terminal and self.end_time else None
        return goodput.goodput(self.facts, now=now, job_start=self.start_time)

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
            "warnings": self.warnings(),
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
            out["skipped"] = self.facts.skipped
            out["checkpoints_refused"] = self.facts.refused
            out["rollbacks"] = self.facts.rollbacks
            out["waiting"] = (self.facts.waiting or {}).get("message")
            out["goodput"] = self.goodput()
            out["preempted"] = self.facts.preempted
            from raytrain.events import checkpoint_timings

            out["checkpoint_timings"] = checkpoint_timings(self.facts)
        return out
