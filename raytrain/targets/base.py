"""One interface for every place a plan can run.

``dry_run(plan)`` builds the exact request with no side effects; ``submit(request)`` only sends it.
"""
from __future__ import annotations

import abc
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from raytrain.config.plan import Plan
from raytrain.status import JobInfo

# Files never shipped with a job's folder, whatever .gitignore says.
SECRET_EXCLUDES = [
    ".git",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    ".netrc",
    ".ssh",
    ".aws",
    ".kube",
    "*.kubeconfig",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
]

# Environment the runtime needs on every process of the job (users can override each with --env).
RUNTIME_ENV_VARS = {
    "RAY_DEDUP_LOGS": "0",  # progress lines must reach the log undeduplicated
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # ray.train.report returns in ~0.1 s instead of ~1.7 s
    "PYTHONUNBUFFERED": "1",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # else every print of the job reaches the log twice
}


@dataclass
class Request:
    """Everything a target will send: shown verbatim by --dry-run."""

    target: str
    address: str
    submission_id: str
    run_name: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    entrypoint_num_cpus: float = 0
    plan: Plan | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("plan")
        return out


@dataclass
class JobHandle:
    target: str
    address: str
    job_id: str
    name: str


def new_submission_id(name: str) -> str:
    """Unique and readable; chosen client-side so that a retried submit can never start a job twice."""
    return f"raytrain-{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


class Target(abc.ABC):
    """A cluster that runs Ray jobs."""

    kind: str = "abstract"

    @abc.abstractmethod
    def dry_run(self, plan: Plan) -> Request: ...

    @abc.abstractmethod
    def submit(self, request: Request) -> JobHandle: ...

    @abc.abstractmethod
    def status(self, job_id: str, *, with_facts: bool = True) -> JobInfo: ...

    @abc.abstractmethod
    def logs(self, job_id: str) -> str: ...

    @abc.abstractmethod
    def follow(self, job_id: str, on_text: Callable[[str], None]) -> None:
        """Call ``on_text`` with log text as it arrives until the job ends."""

    @abc.abstractmethod
    def stop(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    def list(self) -> list[JobInfo]: ...
