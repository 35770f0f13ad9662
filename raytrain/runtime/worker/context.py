"""``ctx``: what a job's ``train(ctx)`` receives on every worker. One object for the job; the work is done by
small collaborators: reporting (runtime.worker.reporter), checkpoints (runtime.checkpoint.lifecycle), elastic resizing
(runtime.worker.resize), tensor/pipeline preparation (runtime.worker.parallel) and the memory estimate
(runtime.worker.memory_estimate)."""
from __future__ import annotations

import copy
import time
from typing import Any

from raytrain import events, settings, timings
from raytrain.config.plan import Plan
from raytrain.runtime.worker import heartbeat, preemption, reporter as reporting
from raytrain.runtime.hf import model as hf_model
from raytrain.runtime.checkpoint.lifecycle import Checkpointer
from raytrain.runtime.datasets.batches import Position, ShardBatches
from raytrain.runtime.worker.engine import build_engine, engine_facts
from raytrain.runtime.worker.memory_estimate import emit_estimate
from raytrain.runtime.worker.parallel import build_pipeline, prepare_tensor_parallel
from raytrain.runtime.worker.reporter import Reporter
from raytrain.runtime.worker.throughput import peak_tflops, steps_from_args
from raytrain.runtime.worker.resize import fit_to_world_size


DATA_KEY = "__raytrain_data__"  # the datasets' positions inside a checkpoint's saved state
SKIP_KEY = "__raytrain_skip_rows__"  # rows rollbacks skip ({dataset: {epoch: ids}}), kept by later checkpoints
SPIKE_KEY = "__raytrain_spike_window__"  # --spike-guard's window of good losses, so a restore keeps judging


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
        self, plan: Plan, *, rank: int, local_rank: int, world_size: int, device: Any, restore_from: str | None = None
    ):
        import torch

        self.plan = plan
        self.name = plan.name
        self.args: list[str] = list(plan.job_args)
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision, torch.float32)
        self.train_batch: int = plan.train_batch
        self._checkpoints = Checkpointer(
            restore_from=restore_from, every=plan.checkpoint_every, rank=rank, local_rank=local_rank,
            world_size=world_size, mode=plan.checkpoint_mode,
        )
        self.config, self.grad_accum, parallel = fit_to_world_size(
            plan, copy.deepcopy(plan.deepspeed), world_size=world_size, rank=rank,
            saved_world_size=self._checkpoints.saved_world_size,
        )
        self.micro_batch: int = self.config["train_micro_batch_size_per_gpu"]
        self.tp, self.pp, self.dp = int(parallel["tp"]), int(parallel["pp"]), int(parallel["dp"])
        # Data-parallel rank: the ranks of one TP group (consecutive) or of one pipeline (strided) see
        # the same data. Shard data by dp_rank/dp_size, not by rank/world_size.
        self.dp_rank = rank // self.tp if self.tp > 1 else (rank % self.dp if self.pp > 1 else rank)
        self.dp_size = self.dp
        self.activation_checkpointing = plan.activation_checkpointing
        self.engine = None
        self._zero_init_used = False
        self.state: dict[str, Any] = {}
        self._first_step_marked = False
        self.start_step = 0
        self.resumed_from: str | None = None
        self._reporter = Reporter(rank=rank, train_batch=self.train_batch)
        self._positions: dict[str, Position] = {}  # each --data dataset's position, saved with checkpoints
        self._loaders: list[ShardBatches] = []
        self._skip_rows: dict[str, dict[str, list[int]]] = {}  # what rollbacks skip (runtime.worker.rollback)
        self._step_rows: list[tuple[str, int, list[int]]] = []  # rows handed out since the last optimizer step
        self._spike_window: list[float] | None = None  # restored with a checkpoint
        self._guard: Any = None
        self._reported_wait_s = 0.0
        self.last_save_s: float | None = None  # the last checkpoint's stall (seconds the step paid for it)
        self._reporter.world_size, self._reporter.on_gpu = world_size, plan.scaling.use_gpu
        self._reporter.total_steps = steps_from_args(self.args)
        if plan.scaling.use_gpu and torch.cuda.is_available():
            self._reporter.gpu_peak_tflops = peak_tflops(torch.cuda.get_device_name(device))

    # What the progress line and trackers derive from each report: set them in train(ctx) when known.
    @property
    def total_steps(self) -> int | None:
        """The run's length in optimizer steps (default: a ``--steps N`` job argument): a bar and an ETA."""
        return self._reporter.total_steps

    @total_steps.setter
    def total_steps(self, steps: int | None) -> None:
        self._reporter.total_steps = steps

    @property
    def tokens_per_sample(self) -> float | None:
        """Tokens in one sample (e.g. the sequence length): reports get tokens_per_s."""
        return self._reporter.tokens_per_sample

    @tokens_per_sample.setter
    def tokens_per_sample(self, tokens: float | None) -> None:
        self._reporter.tokens_per_sample = tokens

    @property
    def flops_per_sample(self) -> float | None:
        """Training FLOPs of one sample (forward + backward, e.g. 6 x parameters x tokens): GPU workers' reports
        get tflops_per_gpu and mfu."""
        return self._reporter.flops_per_sample

    @flops_per_sample.setter
    def flops_per_sample(self, flops: float | None) -> None:
        self._reporter.flops_per_sample = flops

    @property
    def checkpoint_every(self) -> int:
        return self._checkpoints.every

    @property
    def monitor(self) -> Any:
        return self._reporter.monitor

    def start_monitor(self, interval: float) -> None:
        """Sample this worker's GPU (NVML) or RSS (CPU workers) in a background thread."""
        self._reporter.start_monitor(interval, gpu=self.plan.scaling.use_gpu)

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
        if optimizer is None and "optimizer" not in self.config:
            optimizer = _default_optimizer(lr, fused=getattr(self.device, "type", "cpu") == "cuda")
        if self.is_main:
            emit_estimate(model, self.plan, world_size=self.world_size, log=self.log, zero_init=self._zero_init_used)
        self._checkpoints.hf_model = hf_model.describe(model)  # an HF model: its config goes with checkpoints
        config = copy.deepcopy(self.config)
        if self.tp > 1:
            prepare_tensor_parallel(model, config, self.tp, self.log)
        self._checkpoints.prepare_restore(config, tp=self.tp, pp=self.pp, log=self.log)
        self.engine = build_engine(
            model,
            optimizer=optimizer,
            config=config,
            lr_scheduler=lr_scheduler,
            model_parameters=model_parameters,
            **kwargs,
        )
        heartbeat.instrument(self.engine)  # phase marks (forward, backward, step) for the hang watchdog
        self._restore()
        self._configure_guard()
        if self.is_main:
            events.emit(events.ENGINE, **engine_facts(self.engine))
        timings.emit("engine_built", rank=self.rank)
        return self.engine

    def zero_init(self) -> Any:
        """``with ctx.zero_init(): model = ...``: under ZeRO-3 the model is built directly partitioned across
        the workers (DeepSpeed ``zero.Init`` with this run's config; transformers' ``from_config`` and
        ``from_pretrained`` too), so a model larger than one worker's memory can be built. Below ZeRO-3 it
        does nothing."""
        self._zero_init_used = True
        return hf_model.zero_init(self.config)

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
        module = build_pipeline(
            layers,
            stages=self.pp,
            loss_fn=loss_fn,
            partition_method=partition_method or self.plan.pp_partition,
            checkpoint_interval=1 if self.activation_checkpointing else 0,
        )
        return self.deepspeed(module, optimizer, lr=lr, **kwargs)

    def activation_checkpointed(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, recomputed in backward when --activation-checkpointing is on (saves activations).
        Activation checkpointing, not a training checkpoint (those are ``--checkpoint-every``)."""
        if not self.activation_checkpointing:
            return fn(*args)
        import torch.utils.checkpoint

        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)

    checkpointed = activation_checkpointed  # the older name, kept for jobs that use it

    # -- data -------------------------------------------------------------------------------------
    def dataset(
        self,
        name: str = "train",
        batch_size: int | None = None,
        *,
        shuffle: bool = False,
        seed: int = 0,
        epochs: int | None = 1,
        map_batches: Any = None,
        columns: list[str] | None = None,
        shuffle_window: int = 10_000,
    ) -> ShardBatches:
        """This data-parallel rank's batches of ``--data NAME=PATH``: dicts of torch tensors on ``ctx.device``
        (text columns stay lists of str), ``batch_size`` rows each (default ``ctx.micro_batch``).

        ``for batch in ctx.dataset("train")`` is ONE epoch, like a PyTorch DataLoader; the next ``for`` over
        the same (or a new) ``ctx.dataset("train")`` continues with the next epoch. ``epochs=N``: each ``for``
        runs N epochs; ``epochs=None``: one endless stream (``next(it)`` in a step loop). A position restored
        mid-epoch (a checkpoint, a restart, ``--resume``) resumes that epoch, and the ``for`` ends at its end.

        Shards are disjoint and cover the dataset exactly once per epoch, and each rank fetches only the
        blocks of its own share (about 1/N of the dataset per epoch); the assignment and order are
        deterministic for (dataset, ``seed``, epoch, ranks) (``shuffle=True``: pieces dealt to ranks in a
        shuffled order, rows shuffled in windows of ``shuffle_window`` rows). ``map_batches``: a function of a
        dict of numpy arrays run on this worker, ahead of the step when ``--prefetch`` > 0 (heavy work belongs
        in the job's ``preprocess(dataset, ctx)``, run once by Ray Data). ``columns``: only these columns.
        The position (epoch, rows consumed per phase) is saved with every checkpoint and restored with it,
        also onto another number of workers (the rest of the epoch re-split over them). Call
        ``ctx.deepspeed()`` before iterating, so the position is restored.
        """
        from raytrain.runtime.datasets import feed as data_feed

        known = [d["name"] for d in self.plan.data]
        if name not in known:
            given = ", ".join(known) or "none"
            raise ValueError(f"ctx.dataset({name!r}): no such dataset; --data gave: {given} (use --data {name}=PATH)")
        loader = ShardBatches(
            data_feed.FeedSource(name), rank=self.dp_rank, size=self.dp_size,
            batch_size=int(batch_size or self.micro_batch), position=self._positions.setdefault(name, Position()),
            epochs=epochs, shuffle=shuffle, seed=seed, shuffle_window=shuffle_window,
            prefetch=int(self.plan.prefetch), device=self.device, map_batches=map_batches, columns=columns,
            drop=_epochs(self._skip_rows.get(name)),
            on_batch=lambda epoch, ids: self._step_rows.append((name, epoch, ids)),
        )
        loader.name = name
        self._loaders.append(loader)
        return loader

    def data_position(self, name: str = "train") -> dict[str, Any]:
        """Where ``ctx.dataset(name)`` is: {"epoch", "rows" (global rows of the epoch already handed out),
        "phases" (how the epoch was split: per number of ranks, the rows each rank consumed)}."""
        return self._positions.setdefault(name, Position()).to_dict()

    def _data_wait(self) -> float | None:
        """Seconds the job waited for data since the last report (None without ctx.dataset)."""
        if not self._loaders:
            return None
        total = sum(loader.wait_s for loader in self._loaders)
        waited, self._reported_wait_s = total - self._reported_wait_s, total
        return waited

    def _saved_state(self) -> dict[str, Any]:
        state = dict(self.state)
        if self._positions:
            state[DATA_KEY] = {k: p.to_dict() for k, p in self._positions.items()}
        if getattr(self, "_skip_rows", None):
            state[SKIP_KEY] = self._skip_rows
        spike = getattr(getattr(self, "_guard", None), "spike", None)
        if spike is not None:
            state[SPIKE_KEY] = list(spike.losses)
        return state

    # -- the guard's additions: rows of a bad step, --spike-guard, rollbacks ---------------------------
    def _configure_guard(self) -> None:
        from raytrain.runtime.worker import guard, rollback

        self._guard = getattr(self.engine, "_raytrain_guard", None)
        if self._guard is None:
            return
        if self.plan.rollback_after > 0 and self.plan.data:
            for entry in rollback.ledger() or []:  # earlier worker groups' rollbacks in this job
                if entry.get("dp", self.dp_size) != self.dp_size:  # dropped unevenly, ranks would leave lockstep
                    self.log(f"raytrain: the rows of the rollback at step {entry.get('step')} are read again: "
                             f"{entry.get('dp')} data-parallel ranks read them, {self.dp_size} read on")
                    continue
                rollback.merge_rows(self._skip_rows, entry.get("rows") or {})
            for loader in self._loaders:  # datasets opened before the engine
                loader.set_drop(_epochs(self._skip_rows.get(getattr(loader, "name", ""))))
        self._guard.configure(
            spike=guard.SpikeRule(self._spike_window) if self.plan.spike_guard else None,
            rows=self._take_step_rows, rollback_after=self.plan.rollback_after, on_rollback=self._rollback,
        )

    def _take_step_rows(self) -> list[tuple[str, int, list[int]]]:
        rows, self._step_rows = self._step_rows, []
        return rows

    def _rollback(self, bad: list[dict]) -> None:
        """``--rollback-after`` bad steps in a row (``bad``: each with every rank's rows): every rank raises
        Rollback (or RollbackLimit past ``--max-rollbacks``) after rank 0 kept the rows on the job's board."""
        import torch.distributed as dist

        from raytrain.runtime.worker import rollback

        rows: dict[str, dict[str, list[int]]] = {}
        for step in bad:
            rollback.merge_rows(rows, step.get("rows") or {})
        done = rollback.ledger()
        count = len(done) if done is not None else None
        last = bad[-1]["message"]
        steps = f"{len(bad)} bad step{'s' if len(bad) > 1 else ''} in a row"
        if count is None:
            raise rollback.RollbackLimit(f"{steps} (last: {last}); cannot roll back: the job's board is gone")
        if count >= self.plan.max_rollbacks:
            raise rollback.RollbackLimit(
                f"{steps} (last: {last}) after {count} rollback{'s' if count != 1 else ''} "
                f"(--max-rollbacks {self.plan.max_rollbacks})")
        saved = self._checkpoints.last_saved_step
        to = f"the checkpoint of step {saved}" if saved else "the start of the run"
        n = sum(len(ids) for epochs in rows.values() for ids in epochs.values())
        message = (f"rollback {count + 1} of at most {self.plan.max_rollbacks}: {steps} (last: {last}); back to "
                   f"{to}, skipping {n} row{'s' if n != 1 else ''}" + (" of the data" if n else ""))
        entry = {"step": bad[-1]["step"], "steps": [b["step"] for b in bad], "to_step": saved or 0,
                 "rows": rows, "message": message, "dp": self.dp_size}
        kept = True
        if self.is_main:
            kept = rollback.note(entry)
            events.emit(events.ROLLBACK, **entry)
        if self.world_size > 1:  # the rows are on the board before any rank's failure ends the group
            dist.barrier()
        if not kept:
            raise rollback.RollbackLimit(f"{steps} (last: {last}); cannot roll back: the job's board did not answer")
        raise rollback.Rollback(message)

    def _restore(self) -> None:
        restored = self._checkpoints.restore(self.engine)
        if restored is None:
            return
        step, self.state = restored
        from raytrain.runtime.worker import rollback

        rollback.merge_rows(self._skip_rows, self.state.pop(SKIP_KEY, None) or {})
        self._spike_window = self.state.pop(SPIKE_KEY, None)
        for name, pos in (self.state.pop(DATA_KEY, None) or {}).items():
            restored = Position(**pos)  # epoch, rows, and the epoch's phases (absent in older checkpoints)
            position = self._positions.setdefault(name, Position())
            position.epoch, position.rows, position.phases = restored.epoch, restored.rows, restored.phases
        self.start_step = step
        self._reporter.resume_at(step)
        self.resumed_from = self._checkpoints.restore_from
        self.log(f"raytrain: restored step {step} from {self.resumed_from}")

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
        clean = self._reporter.report(
            metrics, engine_step=getattr(self.engine, "global_steps", None), data_wait_s=self._data_wait(),
            engine=self.engine,
        )
        if not self._first_step_marked:
            self._first_step_marked = True
            timings.emit("first_step", rank=self.rank)
        if checkpoint is None:
            checkpoint = self._checkpoints.due(int(clean["step"]))
        if checkpoint and self.engine is not None:
            if self._reporter.trackers is not None:  # a restore resumes after this step: log up to it first
                self._reporter.trackers.flush()
            self._save(clean)
        if self.engine is not None:  # a preemption notice on any rank: all save this step, then restart
            preemption.check(self, clean)

    def _save(self, metrics: dict[str, Any]) -> None:
        """A checkpoint, unless the weights are non-finite on any rank (then an event: a restart must never
        resume from ruined weights). Every rank calls it."""
        from raytrain import events
        from raytrain.runtime.worker import guard

        (bad,) = guard.agreed_flags([not guard.local_weights_finite(self.engine)],
                                    device=getattr(self.engine, "device", "cpu"), world_size=self.world_size)
        if bad:
            step = int(metrics["step"])
            if self.is_main:
                events.emit(events.REFUSED, step=step,
                            message=f"checkpoint of step {step} not written: the weights are non-finite")
            return
        started = time.perf_counter()
        self._checkpoints.save(self.engine, metrics, self._saved_state())
        # what the step paid for the save (goodput's checkpoint stalls; a preemption's deadline check)
        self.last_save_s = time.perf_counter() - started
        if self.is_main:
            stall = {"step": int(metrics["step"]), "stall_s": round(self.last_save_s, 4), "time": round(time.time(), 3)}
            events.emit(events.CHECKPOINT_STALL, **stall)
            feed = getattr(getattr(self, "_reporter", None), "goodput", None)  # rank 0 with --track
            if feed is not None:
                feed.add({"event": events.CHECKPOINT_STALL, **stall})

    def finish(self) -> None:
        """After train(ctx) returns: a final checkpoint if checkpointing is on and the last step has none;
        every worker's peak memory. A last reported loss or weights that are non-finite raise ``NonFiniteRun``
        (the run fails, exit 1, with the reason; no final checkpoint)."""
        from raytrain.runtime.worker import guard

        last = self._reporter.last_metrics
        # a run whose last loss or whose weights are non-finite did not succeed, whatever train(ctx) returned
        problem = guard.ending_problem(self.engine, last, rank=self.rank, world_size=self.world_size)
        if problem is None and self.engine is not None and self._checkpoints.final_save_needed(last):
            self._save(dict(last))
        if problem is None:
            self._checkpoints.finish()  # the last async save is committed before the job ends
        self._reporter.finish()
        if problem is not None:
            raise guard.NonFiniteRun(problem)


def _epochs(rows: dict[str, list[int]] | None) -> dict[int, list[int]]:
    return {int(epoch): ids for epoch, ids in (rows or {}).items()}


def _default_optimizer(lr: float, *, fused: bool) -> Any:
    """``params -> torch.optim.AdamW(lr=lr)``: created by DeepSpeed from the final (e.g. tensor-split)
    parameters; fused on CUDA."""
    import torch

    def optimizer(params: Any) -> Any:
        params = [p for p in params if getattr(p, "requires_grad", True)]
        return torch.optim.AdamW(params, lr=lr, fused=True) if fused else torch.optim.AdamW(params, lr=lr)

    return optimizer


def _goodput_feed(plan: Plan, run_name: str) -> Any:
    """Rank 0's goodput feed for the trackers, seeded with the run's record so far (earlier worker groups)."""
    from raytrain import goodput, run_record

    folder = run_record.record_dir(plan.storage, run_name)
    try:
        lines = run_record.read_lines(folder) if folder else []
    except OSError:  # no record: goodput from this worker group's reports only
        lines = []
    return goodput.Feed(lines)


def make_context(plan: Plan, *, restore_from: str | None, run_name: str = "") -> TrainContext:
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
    )
    if plan.track:  # rank 0 logs every report to --track's trackers, in one tracker run per raytrain run
        from raytrain.runtime.tracking import trackers

        run_name = run_name or settings.get("RAYTRAIN_RUN_NAME") or plan.name
        ctx._reporter.trackers = trackers.start(plan, rank=ctx.rank, run_name=run_name, log=ctx.log)
        if ctx._reporter.trackers is not None:  # a hang's summary reaches the trackers too
            heartbeat.ON_HANG.append(ctx._reporter.trackers.note)
            ctx._reporter.goodput = _goodput_feed(plan, run_name)
            ctx._checkpoints.on_commit = ctx._reporter.goodput.add  # each save's costs reach the trackers
    if reporting.MONITOR_INTERVAL_S > 0:
        ctx.start_monitor(reporting.MONITOR_INTERVAL_S)
    return ctx
