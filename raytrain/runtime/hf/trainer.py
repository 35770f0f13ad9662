"""A Hugging Face Trainer script's progress in raytrain's reporting path, without editing the script.

While a Trainer script runs (script mode), ``transformers.Trainer.__init__`` is wrapped so that every Trainer
the script builds gets :class:`RaytrainCallback`, which turns the Trainer's logs (loss, learning rate, grad
norm) into raytrain's metrics events (the progress line, ``jobs status``), with throughput from the Trainer's
own batch arithmetic and the memory sampler's readings. The Trainer logs every ``logging_steps`` (500 by
default); the callback asks for a log every ``LOG_EVERY_STEPS`` steps and at the last step, so the progress
line moves. The decision must be the same on every rank: a Trainer log gathers the loss from all ranks (a
collective), so a per-rank clock would make ranks log at different steps and the collectives mismatch.

Checkpoints: after the Trainer wrote ``checkpoint-N`` (``on_save``, on every rank), each rank reports its files
of it to Ray Train storage (raytrain.runtime.checkpoint.hf_trainer); ``Trainer.train`` is wrapped so that a restore
point (a restart after a failure, or ``--resume``) reaches it as ``resume_from_checkpoint``, resharded when the
number of workers changed (hf_checkpoints.prepare_resume).
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator

from raytrain.runtime.checkpoint.hf_trainer import Resume
from raytrain.runtime.worker import reporter as reporting
from raytrain.runtime.worker.reporter import Reporter

# Every step: the progress line moves with each one; a log is a loss gather (one small collective) per step.
LOG_EVERY_STEPS = 1

LOG_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch"}


def make_callback(reporter: Reporter, *, log_every: int, world_size: int = 1, checkpoints: bool = False) -> Any:
    """A ``transformers.TrainerCallback`` feeding ``reporter`` and, with ``checkpoints`` (in a Ray Train worker),
    reporting the Trainer's checkpoints (built here: transformers is imported only on workers that run a
    Trainer script)."""
    from transformers import TrainerCallback

    class RaytrainCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            world = max(int(getattr(args, "world_size", 1) or 1), 1)
            reporter.train_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
            reporter.restart_clock(int(state.global_step))

        def on_step_end(self, args, state, control, **kwargs):
            last = state.max_steps and state.global_step >= state.max_steps
            if state.global_step % log_every == 0 or last:  # a function of the step: the same on every rank
                control.should_log = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:
                return
            metrics = {mine: logs[theirs] for theirs, mine in LOG_KEYS.items() if theirs in logs}
            reporter.report({**metrics, "step": int(state.global_step)})

        def on_save(self, args, state, control, **kwargs):
            if not checkpoints:
                return
            from raytrain.runtime.checkpoint import hf_trainer as hf_checkpoints

            step = int(state.global_step)
            last = reporter.last_metrics
            metrics = dict(last) if last.get("step") == step else {"step": step}
            folder = os.path.join(args.output_dir, f"checkpoint-{step}")
            batch = {"micro": int(args.per_device_train_batch_size), "world_size": world_size,
                     "grad_accum": int(args.gradient_accumulation_steps)}
            hf_checkpoints.report(
                folder, rank=reporter.rank, world_size=world_size, step=step, metrics=metrics, batch=batch
            )

    return RaytrainCallback()


@contextlib.contextmanager
def cpu_process_group_for_accelerate() -> Iterator[None]:
    """Under DeepSpeed on CPU workers, Accelerate (which the Trainer builds its distributed state with) finds no
    distributed backend for a CPU device and counts one process: the Trainer then fills train_batch_size for
    a world of 1 and DeepSpeed refuses it. While active, a PartialState that finds no backend while a process
    group exists (Ray Train's gloo group) takes that group's backend, as a MULTI_CPU run (then DEEPSPEED)."""
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    original = PartialState._prepare_backend

    @functools.wraps(original)
    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        found, kind = original(self, cpu, sagemaker_dp, backend)
        if found is None and dist.is_available() and dist.is_initialized():
            return dist.get_backend(), DistributedType.MULTI_CPU
        return found, kind

    PartialState._prepare_backend = _prepare_backend
    try:
        yield
    finally:
        PartialState._prepare_backend = original


@contextlib.contextmanager
def resume_hook(resume: Resume | None, *, rank: int, world_size: int) -> Iterator[None]:
    """While active, ``Trainer.train`` continues from ``resume`` (raytrain's restore point: a restart after a
    failure, or ``--resume``; resharded by hf_checkpoints.prepare_resume when the world size changed) whatever
    ``resume_from_checkpoint`` the script passes."""
    if resume is None:
        yield
        return
    import transformers

    from raytrain.runtime.checkpoint.hf_trainer import check_batch

    original = transformers.Trainer.train

    @functools.wraps(original)
    def train(self, resume_from_checkpoint=None, *args: Any, **kwargs: Any) -> Any:
        check_batch(resume, micro=int(self.args.per_device_train_batch_size), world_size=world_size,
                    grad_accum=int(self.args.gradient_accumulation_steps))
        if rank == 0:
            print(f"raytrain: the Trainer resumes from step {resume.step} ({resume.source})", flush=True)
        return original(self, resume.folder, *args, **kwargs)

    transformers.Trainer.train = train
    try:
        yield
    finally:
        transformers.Trainer.train = original


@contextlib.contextmanager
def trainer_hooks(
    *, rank: int, train_batch: int, gpu: bool, world_size: int = 1, resume: Resume | None = None,
    checkpoints: bool = False,
) -> Iterator[Reporter]:
    """While active, every ``transformers.Trainer`` gets raytrain's callback (progress; with ``checkpoints``,
    in a Ray Train worker, its checkpoints reported to storage) and continues from ``resume``
    (hf_checkpoints.prepare_resume); the memory sampler runs."""
    import transformers

    reporter = Reporter(rank=rank, train_batch=train_batch)
    if reporting.MONITOR_INTERVAL_S > 0:
        reporter.start_monitor(reporting.MONITOR_INTERVAL_S, gpu=gpu)
    original = transformers.Trainer.__init__

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.add_callback(make_callback(
            reporter, log_every=LOG_EVERY_STEPS, world_size=world_size, checkpoints=checkpoints
        ))

    transformers.Trainer.__init__ = __init__
    try:
        with cpu_process_group_for_accelerate() if not gpu else contextlib.nullcontext(), resume_hook(
            resume, rank=rank, world_size=world_size
        ):
            yield reporter
    finally:
        transformers.Trainer.__init__ = original
        reporter.finish()
