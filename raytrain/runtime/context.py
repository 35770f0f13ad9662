"""``ctx``: what a job's ``train(ctx)`` receives on every worker."""
from __future__ import annotations

import copy
import os
import sys
import time
from typing import Any, Callable

from raytrain import events


def _as_float(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


class TrainContext:
    """Rank, device, resolved DeepSpeed config and the job's arguments, plus engine and reporting helpers.

    Attributes: ``rank``, ``local_rank``, ``world_size``, ``device``, ``dtype`` (the compute dtype of the
    chosen precision), ``args`` (the JOB_ARGS after ``--``), ``config`` (the exact DeepSpeed dict),
    ``micro_batch``, ``grad_accum``, ``train_batch``, ``name``.
    """

    def __init__(self, plan: dict[str, Any], *, rank: int, local_rank: int, world_size: int, device: Any):
        import torch

        self.plan = plan
        self.name = plan["name"]
        self.args: list[str] = list(plan.get("job_args") or [])
        self.config: dict[str, Any] = copy.deepcopy(plan["deepspeed"])
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan["precision"], torch.float32)
        self.micro_batch: int = self.config["train_micro_batch_size_per_gpu"]
        self.grad_accum: int = self.config["gradient_accumulation_steps"]
        self.train_batch: int = self.config["train_batch_size"]
        self.engine = None
        self._steps = 0
        self._last_time = time.perf_counter()
        self._last_step = 0
        self._started = self._last_time

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *parts: Any) -> None:
        """Print on rank 0 only (the others would repeat it)."""
        if self.is_main:
            print(*parts, flush=True)

    def deepspeed(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        lr: float = 1e-3,
        lr_scheduler: Any = None,
        model_parameters: Any = None,
        **kwargs: Any,
    ) -> Any:
        """A DeepSpeed engine for ``model`` built from the resolved config.

        ``optimizer``: a torch optimizer, a callable ``params -> optimizer``, or None. With None and no
        ``optimizer`` section in the config, raytrain uses ``torch.optim.AdamW(lr=lr)`` (fused on CUDA), a
        client optimizer that needs no compiled DeepSpeed op.
        """
        from raytrain.runtime.engine import build_engine

        params = model_parameters if model_parameters is not None else [
            p for p in model.parameters() if p.requires_grad
        ]
        if optimizer is None and "optimizer" not in self.config:
            import torch

            fused = getattr(self.device, "type", "cpu") == "cuda"
            optimizer = torch.optim.AdamW(params, lr=lr, fused=fused) if fused else torch.optim.AdamW(params, lr=lr)
        elif callable(optimizer) and not hasattr(optimizer, "step"):
            optimizer = optimizer(params)
        self.engine = build_engine(
            model,
            optimizer=optimizer,
            config=copy.deepcopy(self.config),
            lr_scheduler=lr_scheduler,
            model_parameters=params if optimizer is None else None,
            **kwargs,
        )
        return self.engine

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        """Report metrics after an optimizer step: to Ray Train (every rank) and to the terminal (rank 0).

        ``step`` defaults to the engine's global step (or a count of reports); ``samples_per_s`` is derived
        from the global train batch size.
        """
        import ray.train

        clean = {k: _as_float(v) for k, v in metrics.items()}
        self._steps += 1
        step = clean.get("step")
        if step is None:
            step = getattr(self.engine, "global_steps", None) or self._steps
            clean["step"] = step
        now = time.perf_counter()
        steps_done = max(int(step) - self._last_step, 0)
        dt = now - self._last_time
        if steps_done and dt > 0:
            clean.setdefault("samples_per_s", round(steps_done * self.train_batch / dt, 3))
            clean.setdefault("step_time_s", round(dt / steps_done, 4))
        self._last_time, self._last_step = now, int(step)
        clean.setdefault("elapsed_s", round(now - self._started, 3))
        if self.is_main:
            events.emit(events.METRICS, **clean)
        ray.train.report(clean, checkpoint=checkpoint)


def make_context(plan: dict[str, Any]) -> TrainContext:
    """The context of the calling Ray Train worker."""
    import ray.train
    import ray.train.torch

    rctx = ray.train.get_context()
    return TrainContext(
        plan,
        rank=rctx.get_world_rank(),
        local_rank=rctx.get_local_rank(),
        world_size=rctx.get_world_size(),
        device=ray.train.torch.get_device(),
    )
