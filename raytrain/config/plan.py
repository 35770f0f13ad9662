"""The validated plan: everything a target needs to run a job, and nothing target-specific."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Scaling:
    """The Ray Train scaling request: one worker per GPU (or per CPU slot on gloo)."""

    num_workers: int
    use_gpu: bool
    resources_per_worker: dict[str, float]
    placement_strategy: str = "PACK"
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
    checkpoint_every: int = 0
    keep: int | None = None
    max_failures: int = 0
    resume: str | None = None
    activation_checkpointing: bool = False
    pp_partition: str = "parameters"
    interface: str | None = None  # the network interface every worker must use (--interface)
    timeout_s: float = 600.0  # torch.distributed process-group timeout (--timeout)
    mode: str = "train"  # "train": the workers call train(ctx); "script": they run the file as __main__

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        data = dict(data)
        data["scaling"] = Scaling(**data["scaling"])
        return cls(**data)
