"""The validated plan: everything a target needs to run a job, and what a target decides for the job's runtime
(``local_cluster``): the driver and the workers learn it from the plan, not from environment variables.

It travels as JSON (``$RAYTRAIN_PLAN`` for the driver, ``train_loop_config["plan"]`` for the workers) and is
read back with :meth:`Plan.from_dict`. Defaults are the option declarations' (raytrain.config.options).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from raytrain.config.options import DEFAULTS, PLACEMENTS


@dataclass
class Scaling:
    """The Ray Train scaling request: one worker per GPU (or per CPU slot on gloo)."""

    num_workers: int
    use_gpu: bool
    resources_per_worker: dict[str, float]
    placement_strategy: str = PLACEMENTS[DEFAULTS["placement"]]
    min_workers: int | None = None  # elastic: Ray Train may run with min_workers..num_workers workers

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def workers_label(self) -> str:
        return f"{self.min_workers}-{self.num_workers}" if self.elastic else str(self.num_workers)

    def total(self) -> dict[str, float]:
        return {k: v * self.num_workers for k, v in self.resources_per_worker.items()}


@dataclass
class Plan:
    name: str
    job_file: str  # absolute path on the submitting machine
    job_dir: str  # shipped as working_dir
    job_module: str  # the job file's path inside job_dir
    job_args: list[str]
    deepspeed: dict[str, Any]
    scaling: Scaling
    parallel: dict[str, int]  # dp, tp, pp
    train_batch: int  # global batch: micro-batch x grad-accum x data-parallel size
    precision: str
    zero: int
    offload: str
    storage: str | None
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_every: int = DEFAULTS["checkpoint_every"]
    keep: int | None = None
    checkpoint_mode: str = "async"  # --checkpoint-mode: async (a snapshot, written in the background) or sync
    max_failures: int = DEFAULTS["max_failures"]
    resume: str | None = None
    activation_checkpointing: bool = DEFAULTS["activation_checkpointing"]
    pp_partition: str = DEFAULTS["pp_partition"]
    interface: str | None = None  # the network interface every worker must use (--interface)
    timeout_s: float = DEFAULTS["timeout"]  # torch.distributed process-group timeout (--timeout)
    start_timeout_s: float = DEFAULTS["start_timeout"]  # how long the workers may wait to be placed
    hang_timeout_s: float | None = None  # --hang-timeout: None = from the step time, 0 = no watchdog
    on_hang: str = DEFAULTS["on_hang"]  # --on-hang: report, restart, fail
    spike_guard: bool = DEFAULTS["spike_guard"]  # --spike-guard: a loss spike is a bad step
    rollback_after: int = DEFAULTS["rollback_after"]  # --rollback-after: bad steps in a row; 0 = no rollback
    max_rollbacks: int = DEFAULTS["max_rollbacks"]  # --max-rollbacks: then the job fails
    data: list[dict[str, str]] = field(default_factory=list)  # --data: [{"name", "path", "format"}]
    prefetch: int = DEFAULTS["prefetch"]  # --prefetch: batches ctx.dataset prepares ahead
    data_timeout_s: float = DEFAULTS["data_timeout"]  # --data-timeout: a dataset's feed may stall this long
    mode: str = "train"  # "train": the workers call train(ctx); "script": they run the file as __main__
    micro_batch: int = DEFAULTS["micro_batch"]
    grad_accum: int = DEFAULTS["grad_accum"]
    hf_trainer: bool = False  # script mode: a Hugging Face Trainer script (raytrain.config.hf_trainer)
    # script mode: options the workers add to the script's command line when its parser defines them and the
    # user did not give them (a Trainer script's --per_device_train_batch_size ...)
    script_defaults: dict[str, str] = field(default_factory=dict)
    track: list[str] = field(default_factory=list)  # --track: tensorboard, mlflow, wandb (rank 0 logs to each)
    mlflow_uri: str | None = None  # --mlflow-uri; None: a file store under the run's storage
    track_args: bool = DEFAULTS["track_args"]  # --track-args: the job's arguments among the trackers' params
    # Set by the local target as it builds the request, not by a flag: the job runs on raytrain's own local
    # cluster (`cluster up`), which no autoscaler sizes and where the driver removes leaked placement groups
    # itself (raytrain.ray_tuning.lean_trainer). None: not said (any other cluster).
    local_cluster: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """The inverse of :meth:`to_dict`; fields missing from ``data`` take their defaults."""
        data = dict(data)
        data["scaling"] = Scaling(**data["scaling"])
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))
