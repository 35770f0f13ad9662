"""One interface for every place a plan can run.

``dry_run(plan)`` builds the exact request with no side effects; ``submit(request)`` only sends it.
"""
from __future__ import annotations

import abc
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from raytrain.capacity import Node
from raytrain.config.options import CPU_ALLOCATOR_VAR
from raytrain.config.plan import Plan
from raytrain.errors import ClusterError, RaytrainError
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
    "kubeconfig",
    "kubeconfig.*",
    ".git-credentials",
    ".docker",
    ".gnupg",
    ".pypirc",
    ".npmrc",
    ".azure",
    "**/.config/gcloud",
    "application_default_credentials.json",
    "**/.cache/huggingface/token",
    "**/.cache/huggingface/stored_tokens",
    "**/.huggingface/token",
    "*.tfstate",
    "*.tfstate.*",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
]

STOP_WAIT_S = 60.0  # how long `jobs stop` waits for a job to have stopped
RELEASE_WAIT_S = 20.0  # then how long for its workers and placement groups to be gone before removing them

# Environment the runtime needs on every process of the job (users can override each with --env).
RUNTIME_ENV_VARS = {
    "RAY_DEDUP_LOGS": "0",  # progress lines must reach the log undeduplicated
    "PYTHONUNBUFFERED": "1",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # else every print of the job reaches the log twice
}

def tuning_env_vars() -> dict[str, str]:
    """``RAYTRAIN_RAY_TUNING`` as the submitting shell sets it, passed on to the job (its own --env wins), so one
    variable turns the tunings off for the job wherever it runs (raytrain.ray_tuning)."""
    from raytrain import settings

    value = settings.raw("RAYTRAIN_RAY_TUNING")
    if value is None or not value.strip():
        return {}
    settings.get("RAYTRAIN_RAY_TUNING")  # a malformed value is refused here, naming the variable
    return {"RAYTRAIN_RAY_TUNING": value.strip().lower()}


# The allocator of a job whose workers train on CPU.
# - RAYTRAIN_CPU_ALLOCATOR=jemalloc: on nodes raytrain starts (`cluster up`, `cluster join`), each of the job's
#   processes starts with the jemalloc Ray ships for its raylet preloaded (raytrain.ray_tuning.ray_setup_worker).
#   A 2-worker ZeRO-1 job's steps were 14 % shorter with it, ZeRO-3's 6 % (docs/benchmarks.md). Kubernetes pods start
#   Ray from their image, where nothing reads the variable, so those targets leave it out (jemalloc=False).
# - GLIBC_TUNABLES, for glibc's malloc where jemalloc is not there (or turned off): tensors up to 32 MB come
#   from the allocator's heaps instead of fresh mmaps, and freed memory stays in the process for the next step
#   (up to 256 MB at the top of a heap, 64 MB of padding) instead of going back to the kernel and being faulted
#   in again: with glibc's defaults a rank page-faults several times as often and steps slower than the same
#   job under torchrun (figures: docs/benchmarks.md, overhead.py).
#   Ignored where the C library is not glibc.
# `--env RAYTRAIN_CPU_ALLOCATOR=glibc` keeps glibc's malloc; `--env GLIBC_TUNABLES=` (empty) its defaults.
CPU_ALLOCATOR_ENV_VARS = {
    "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432"
                      ":glibc.malloc.top_pad=67108864",
}


def allocator_env_vars(plan: Plan, *, jemalloc: bool = True) -> dict[str, str]:
    """The allocator settings for ``plan``'s job where its workers train on CPU (the only place they are
    known to help; none for GPU workers): CPU_ALLOCATOR_ENV_VARS and, with ``jemalloc`` (the target's nodes may be
    raytrain's), RAYTRAIN_CPU_ALLOCATOR=jemalloc."""
    if plan.scaling.use_gpu:
        return {}
    return {**CPU_ALLOCATOR_ENV_VARS, **({CPU_ALLOCATOR_VAR: "jemalloc"} if jemalloc else {})}


# Added on the embedded local cluster, where each saves a process or per-step work that serves nothing there.
LOCAL_RUNTIME_ENV_VARS = {
    # Ray Train's preemption watcher is one more actor process per job, polling for node drains (spot
    # instances, autoscaler scale-down) that a single local node never has; its start also logs a red
    # core_worker error line ("max_restarts > 0") that means nothing to the user.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray Train's Prometheus metrics: the local head does not collect metrics (clusters/ray_process.py).
    "RAY_TRAIN_METRICS_ENABLED": "0",
}
# raytrain's own behaviour on the local cluster travels in the plan instead (Plan.local_cluster).


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
    upload: dict[str, Any] | None = None  # the job folder's files this submit uploads: folder, files, bytes

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("plan")
        return out

    def masked(self) -> "Request":
        """This request as --dry-run shows it: the values of the job's --env replaced by MASK, the plan it
        carries redacted (raytrain.redact)."""
        import copy
        import dataclasses as dc

        keys = set((self.plan.env if self.plan else {}) or {})
        runtime_env = mask_env(copy.deepcopy(self.runtime_env), keys)
        return dc.replace(self, runtime_env=runtime_env)

    def to_text(self) -> str | None:
        """The request in its target's own format (Kubernetes manifests), as --dry-run prints it; None where
        raytrain's summary of the plan is the better view (a Ray Jobs API submission)."""
        return None


MASK = "<hidden>"


def mask_env(runtime_env: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """``runtime_env`` with the values of ``keys`` in its env_vars masked and its RAYTRAIN_PLAN redacted
    (raytrain.redact: job arguments, URIs), in place; returned."""
    import json

    from raytrain import redact

    env_vars = runtime_env.get("env_vars") or {}
    for key in keys & set(env_vars):
        env_vars[key] = MASK
    if env_vars.get("RAYTRAIN_PLAN"):
        env_vars["RAYTRAIN_PLAN"] = json.dumps(redact.plan_dict(json.loads(env_vars["RAYTRAIN_PLAN"])), sort_keys=True)
    return runtime_env


def shipped_plan(plan: Plan) -> str:
    """RAYTRAIN_PLAN as the cluster gets it: --env values are masked (the workers get them as env vars, the
    plan is shown on the dashboard and in the RayJob object)."""
    import dataclasses as dc

    return dc.replace(plan, env={k: MASK for k in plan.env}).to_json()


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
    """A cluster that runs Ray jobs: everything callers (``api``, the CLI) use, declared here.

    ``dry_run(plan)`` is pure: it returns the exact request, changes neither the plan nor the target, and
    talks to nothing but (for Kubernetes) the API server to read objects. ``submit(request)`` only sends it.
    """

    kind: str = "abstract"
    address: str = ""
    # The run's storage is on this machine: checks of it (--resume) can run here before submitting.
    storage_is_local: bool = False
    # nodes() reads a description of the cluster (a RayCluster's spec), not the cluster: its capacity check
    # runs before anything connects to it (the version check does connect)
    nodes_without_connecting: bool = False

    # -- the cluster --------------------------------------------------------------------------------------
    def running(self) -> bool:
        """False only where the cluster is known not to run yet (the local one before `cluster up`)."""
        return True

    def check_versions(self) -> list[str]:
        """Refuse (ClusterError) a cluster whose Ray, Python, torch or DeepSpeed the runtime cannot run on; the
        warning lines to show. Here: nothing to check."""
        return []

    def ensure_running(self) -> bool:
        """Start the cluster if this target starts its own and it is not running; True if this call started
        it. A no-op (False) where there is nothing to start."""
        return False

    @abc.abstractmethod
    def nodes(self, request: Request | None = None) -> list[Node]:
        """Ray's view of the cluster's nodes; with ``request``, of the cluster that request runs on (a RayJob
        brings its own, sized for the job)."""

    def has_gpus(self) -> bool:
        """Read-only look: does the cluster offer GPUs? False when it cannot be read."""
        try:
            return any(n.resources.get("GPU", 0) > 0 for n in self.nodes())
        except ClusterError:
            return False

    def default_storage(self) -> str | None:
        """The run's storage when --storage is not given (None: Ray's default on the head node)."""
        return None

    # -- one job --------------------------------------------------------------------------------------------
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

    def stop_and_wait(self, job_id: str, *, wait: bool = True, timeout_s: float = STOP_WAIT_S) -> str:
        """Stop the job and (``wait``) wait until it has stopped and its workers and placement groups are gone;
        the line `jobs stop` prints. Raises (exit 1) naming what still runs when the wait runs out."""
        stopped = self.stop(job_id)
        info = self.wait_until_ended(job_id, wait=wait and stopped, timeout_s=timeout_s)
        if not wait or info.state.terminal and not stopped:
            return f"{job_id}: {info.state.value}" + ("" if info.state.terminal else " (stopping; not waited for)")
        if not info.state.terminal:
            raise RaytrainError(
                f"{job_id} is still {info.state.value} {timeout_s:.0f} s after the stop request: its driver has not "
                f"exited (see `raytrain jobs logs {job_id}`); run `raytrain jobs stop {job_id}` again, or stop "
                "the cluster"
            )
        return f"{job_id}: {info.state.value}" + self.release(info)

    def release(self, info: JobInfo, timeout_s: float = RELEASE_WAIT_S) -> str:
        """After the job ended: wait until its workers and placement groups are gone (removing groups Ray
        leaked); what `jobs stop` adds to its line. Targets that cannot look (a RayJob's own cluster) say
        nothing."""
        return ""

    def wait_until_ended(self, job_id: str, *, wait: bool = True, timeout_s: float = STOP_WAIT_S) -> JobInfo:
        """The job's status (without facts), polled until it is terminal or ``timeout_s`` has passed."""
        info = self.status(job_id, with_facts=False)
        deadline = time.monotonic() + timeout_s
        while wait and not info.state.terminal and time.monotonic() < deadline:
            time.sleep(0.2)  # one status read; a stopped driver is gone within a second or two
            info = self.status(job_id, with_facts=False)
        return info

    @abc.abstractmethod
    def list(self) -> list[JobInfo]: ...

    def run_utility(self, module: str, event_kind: str, timeout_s: float = 120.0, args: tuple[str, ...] = ()) -> dict:
        """Run ``python -m MODULE ARGS`` as a short job and return the event it prints (e.g. GPU inventory)."""
        raise ClusterError(f"running {module} is not supported on a {self.kind} target")

    # -- reaching it again ----------------------------------------------------------------------------------
    def reconnect_flags(self) -> list[str]:
        """The CLI flags that point `raytrain jobs ...` at this same cluster."""
        return []

    def close(self) -> None:
        """Release what the target opened (a port-forward); it may be used again afterwards."""

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc) -> None:
        self.close()  # `with make_target(...) as target:` leaves no port-forward open
