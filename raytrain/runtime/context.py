"""``ctx``: what a job's ``train(ctx)`` receives on every worker."""
from __future__ import annotations

import copy
import os
import shutil
import sys
import time
from typing import Any

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
    ``micro_batch``, ``grad_accum``, ``train_batch``, ``name``; after ``ctx.deepspeed()``:
    ``start_step`` (the step to continue from: 0, or the restored checkpoint's), ``resumed_from``
    (the checkpoint restored, or None) and ``state`` (a dict saved with every checkpoint and restored
    with it: put the data position there if it is not a function of the step).
    """

    def __init__(
        self,
        plan: dict[str, Any],
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        device: Any,
        restore_from: str | None = None,
        checkpoint_every: int = 0,
    ):
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
        self.train_batch: int = int(plan.get("train_batch") or self.config["train_batch_size"])
        parallel = plan.get("parallel") or {"dp": world_size, "tp": 1, "pp": 1}
        # Rank 0's marker of the checkpoint this run continues from (world size, tag), read once.
        self._restore_marker = _restore_marker(restore_from)
        scaling = plan.get("scaling") or {}
        if scaling.get("min_workers") is not None:
            # Elastic (--workers MIN-MAX, data parallel only): Ray Train chose this many workers; keep the
            # global batch by changing gradient accumulation.
            from raytrain.config.elastic import rescale

            planned_accum = self.grad_accum
            self.config, self.grad_accum = rescale(self.config, train_batch=self.train_batch, dp=world_size)
            parallel = {"dp": world_size, "tp": 1, "pp": 1}
            saved = self._restore_marker.world_size if self._restore_marker else None
            if rank == 0 and (world_size != scaling["num_workers"] or saved not in (None, world_size)):
                # Smaller than planned, or grown back from a smaller checkpoint: say so.
                events.emit(
                    events.RESIZED,
                    workers=world_size,
                    range=f"{scaling['min_workers']}-{scaling['num_workers']}",
                    planned_workers=scaling["num_workers"],
                    grad_accum=self.grad_accum,
                    planned_grad_accum=planned_accum,
                    train_batch=self.train_batch,
                )
        self.tp, self.pp, self.dp = int(parallel["tp"]), int(parallel["pp"]), int(parallel["dp"])
        # Data-parallel rank: the ranks of one TP group (consecutive) or of one pipeline (strided) see
        # the same data. Shard data by dp_rank/dp_size, not by rank/world_size.
        self.dp_rank = rank // self.tp if self.tp > 1 else (rank % self.dp if self.pp > 1 else rank)
        self.dp_size = self.dp
        self.activation_checkpointing = bool(plan.get("activation_checkpointing"))
        self.checkpoint_every = int(checkpoint_every or 0)
        self.engine = None
        self.state: dict[str, Any] = {}
        self.start_step = 0
        self.resumed_from: str | None = None
        self._restore_from = restore_from
        self._universal: str | None = None  # a resharded copy of the restore point (see deepspeed())
        self._steps = 0
        self._last_step = 0
        self._last_checkpoint_step: int | None = None
        self._last_metrics: dict[str, Any] = {}
        self._started = self._last_time = time.perf_counter()
        self.monitor = None
        self._memory_every_s = 10.0
        self._last_memory_event = 0.0

    # -- memory -----------------------------------------------------------------------------------
    def start_monitor(self, interval: float) -> None:
        """Sample this worker's GPU (NVML) or RSS (CPU workers) in a background thread."""
        from raytrain.runtime.monitor import MemoryMonitor

        use_gpu = bool(self.plan["scaling"]["use_gpu"])
        self.monitor = MemoryMonitor(interval=interval, gpu=True if use_gpu else False).start()

    def _memory_event(self, final: bool = False) -> None:
        if self.monitor is None:
            return
        now = time.monotonic()
        if not final and now - self._last_memory_event < self._memory_every_s:
            return
        self._last_memory_event = now
        peak = self.monitor.peak()
        events.emit(
            events.MEMORY,
            rank=self.rank,
            source=peak["source"],
            rss_peak=peak["rss_peak"],
            gpu_memory_peak=peak["gpu_memory_used_peak"],
            final=final,
        )

    def _predict_memory(self, model: Any) -> None:
        """Rank 0: the planner's per-GPU estimate for this exact model and config, for the job summary."""
        if not self.is_main:
            return
        try:
            from raytrain.planner.memory import Config, estimate
            from raytrain.planner.meta import count_parameters, largest_layer

            params = count_parameters(model)
            largest, _ = largest_layer(model)
            precision = self.plan["precision"] if self.plan["precision"] != "fp16" else "fp16"
            est = estimate(
                Config(zero=self.plan["zero"], offload=self.plan["offload"], precision=precision),
                params=params,
                largest_layer=largest,
                gpus=self.world_size,
                gpus_per_node=max(1, int(self.plan["scaling"]["num_workers"])),
            )
        except Exception as exc:  # the estimate is advisory; never fail training for it
            self.log(f"raytrain: no memory estimate ({type(exc).__name__}: {exc})")
            return
        events.emit(
            events.ESTIMATE,
            params=params,
            model_states=est.states.gpu_total,
            gpu_allocated=est.allocated,
            gpu_total=est.gpu_total,
            cpu_per_node=est.cpu_per_node,
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *parts: Any) -> None:
        """Print on rank 0 only (the others would repeat it)."""
        if self.is_main:
            print(*parts, flush=True)

    # -- engine -----------------------------------------------------------------------------------
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
        """A DeepSpeed engine for ``model`` built from the resolved config, restored from the checkpoint
        this run continues from (if any).

        ``optimizer``: a torch optimizer, a callable ``params -> optimizer``, or None. With None and no
        ``optimizer`` section in the config, raytrain uses ``torch.optim.AdamW(lr=lr)`` (fused on CUDA), a
        client optimizer that needs no compiled DeepSpeed op.
        """
        from raytrain.runtime.engine import build_engine

        if optimizer is None and "optimizer" not in self.config:
            import torch

            fused = getattr(self.device, "type", "cpu") == "cuda"

            def optimizer(params):  # created by DeepSpeed from the final (e.g. tensor-split) parameters
                params = [p for p in params if getattr(p, "requires_grad", True)]
                return torch.optim.AdamW(params, lr=lr, fused=True) if fused else torch.optim.AdamW(params, lr=lr)

        self._predict_memory(model)
        config = copy.deepcopy(self.config)
        if self.tp > 1:
            from raytrain.runtime.parallel import prepare_tensor_parallel

            prepare_tensor_parallel(model, config, self.tp, self.log)
        self._universal = None
        saved = self._restore_marker
        if saved and self.tp == 1 and self.pp == 1:
            from raytrain.runtime import checkpoint

            zero = int((config.get("zero_optimization") or {}).get("stage", 0))
            if checkpoint.needs_reshard(saved.world_size, world_size=self.world_size, zero=zero):
                self.log(f"raytrain: checkpoint saved by {saved.world_size} worker(s), this run has "
                         f"{self.world_size}: resharding ZeRO state (DeepSpeed universal checkpoint)")
                self._universal = checkpoint.to_universal(
                    self._restore_from, saved.tag, local_rank=self.local_rank
                )
                config.setdefault("checkpoint", {})["load_universal"] = True
        self.engine = build_engine(
            model,
            optimizer=optimizer,
            config=config,
            lr_scheduler=lr_scheduler,
            model_parameters=model_parameters,
            **kwargs,
        )
        self._restore()
        return self.engine

    def pipeline(
        self,
        layers: Any,
        loss_fn: Any,
        optimizer: Any = None,
        *,
        lr: float = 1e-3,
        partition_method: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """A DeepSpeed pipeline engine over ``layers`` split into ``--pp`` stages; train with
        ``engine.train_batch(data_iter)`` (one call per optimizer step, ``ctx.grad_accum`` micro-batches
        from ``data_iter``: (inputs, labels) pairs). Also works with --pp 1."""
        from raytrain.runtime.parallel import build_pipeline

        module = build_pipeline(
            layers,
            stages=self.pp,
            loss_fn=loss_fn,
            partition_method=partition_method or self.plan.get("pp_partition") or "parameters",
            checkpoint_interval=1 if self.activation_checkpointing else 0,
        )
        return self.deepspeed(module, optimizer, lr=lr, **kwargs)

    def checkpointed(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, recomputed in backward when --activation-checkpointing is on (saves activations)."""
        if not self.activation_checkpointing:
            return fn(*args)
        import torch.utils.checkpoint

        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)

    def _restore(self) -> None:
        if not self._restore_from:
            return
        from raytrain.runtime import checkpoint

        step, self.state = checkpoint.load(
            self.engine, self._restore_from, rank=self.rank, world_size=self.world_size,
            universal=self._universal,
        )
        self.start_step = self._last_step = self._last_checkpoint_step = step
        self.resumed_from = self._restore_from
        self.log(f"raytrain: restored step {step} from {self._restore_from}")

    # -- reporting and checkpoints ----------------------------------------------------------------
    def report(self, metrics: dict[str, Any], *, checkpoint: bool | None = None) -> None:
        """Report metrics after an optimizer step: to the job's event log (rank 0), which progress, ``jobs
        status`` and trackers read. A metrics-only report costs the step microseconds: it never waits for Ray
        Train (whose ``ray.train.report`` blocks until the controller polls the workers); only a report that
        carries a checkpoint goes through Ray Train, and waits for it.

        ``step`` defaults to the engine's global step; ``samples_per_s`` and ``step_time_s`` are derived
        from the global batch. A checkpoint is saved every ``--checkpoint-every`` steps, or when
        ``checkpoint=True`` (every rank must pass the same value).
        """
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
        clean.setdefault("wall_time", round(time.time(), 3))
        if self.monitor is not None:
            for key, value in self.monitor.metrics().items():
                clean.setdefault(key, value)
        if checkpoint is None:
            checkpoint = bool(self.checkpoint_every) and int(step) % self.checkpoint_every == 0
        self._last_metrics = clean
        if self.is_main:
            events.emit(events.METRICS, **clean)
        self._memory_event()
        if checkpoint and self.engine is not None:
            self._save_checkpoint(clean)

    def _save_checkpoint(self, metrics: dict[str, Any]) -> None:
        """Every rank saves its shard and reports it to Ray Train with the step's metrics (Ray Train keeps
        the latest for restarts and ``Result.metrics``)."""
        import ray.train

        from raytrain.runtime import checkpoint

        step = int(metrics["step"])
        directory = checkpoint.save(
            self.engine, rank=self.rank, world_size=self.world_size, step=step,
            user_state=self.state, metrics=metrics,
        )
        try:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self._last_checkpoint_step = step
        if self.is_main:
            events.emit(events.CHECKPOINT, step=step)

    def finish(self) -> None:
        """After train(ctx) returns: a final checkpoint if checkpointing is on and the last step has none;
        every worker's peak memory."""
        if self.checkpoint_every and self.engine is not None and self._last_metrics:
            if self._last_checkpoint_step != int(self._last_metrics["step"]):
                self._save_checkpoint(dict(self._last_metrics))
        if self.monitor is not None:
            self.monitor.stop()
            self._memory_event(final=True)


def _restore_marker(restore_from: str | None) -> Any:
    """The restore point's rank-0 marker, or None (nothing to restore, or unreadable: checkpoint.load then
    fails with the reason)."""
    if not restore_from:
        return None
    from raytrain.checkpoints import marker as markers

    try:
        return markers.read(restore_from)
    except (OSError, ValueError):
        return None


def make_context(plan: dict[str, Any], *, restore_from: str | None, checkpoint_every: int) -> TrainContext:
    """The context of the calling Ray Train worker."""
    import ray.train
    import ray.train.torch

    rctx = ray.train.get_context()
    ctx = TrainContext(
        plan,
        rank=rctx.get_world_rank(),
        local_rank=rctx.get_local_rank(),
        world_size=rctx.get_world_size(),
        device=ray.train.torch.get_device(),
        restore_from=restore_from,
        checkpoint_every=checkpoint_every,
    )
    interval = float(os.environ.get("RAYTRAIN_MONITOR_INTERVAL_S", "1.0"))
    if interval > 0:
        ctx.start_monitor(interval)
    return ctx
