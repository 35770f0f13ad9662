"""The non-finite guard: a step whose loss or gradients are non-finite on any rank is skipped on every rank.

DeepSpeed alone treats such a step differently per layout (ZeRO-1/2/3 optimizers skip it on their own
overflow check, ZeRO-0's client optimizer applies it and the weights turn NaN). raytrain decides itself,
before DeepSpeed's optimizer step, and makes the skip the same everywhere:

- each rank notes, without a host sync, whether a loss it back-propagated (``engine.backward``; a pipeline's
  last stage: the losses of the batch) was non-finite;
- at the accumulation boundary every rank joins one all-reduce of a ``world_size`` vector (each rank's code
  in its slot) on the job's process group: all ranks see the same verdict, and who saw what. Without ZeRO
  the code also says whether the (reduced) gradients are non-finite: nothing else checks them there. Under
  ZeRO 1-3 DeepSpeed's optimizer computes the global gradient norm and skips a step whose norm is non-finite,
  agreed over every rank; the guard reports that skip (``non-finite gradients``);
- a bad step runs DeepSpeed's own ``_take_model_step`` with the innermost torch optimizer's ``step`` made a
  no-op and no LR scheduler step: the gradients are cleared the way each layout clears them, the weights and
  the optimizer state stay as they were, ``global_steps`` counts the step and ``skipped_steps`` counts the skip
  (what DeepSpeed's own overflow skip leaves).

A per-gradient check as each gradient is computed would name the rank of a gradient-only problem, but costs a
pass over every gradient per micro-batch; the loss names the rank in the common case (a bad sample).

The guard is installed on every engine raytrain builds (``ctx.deepspeed``, ``ctx.pipeline``, script mode's
``deepspeed.initialize``).
"""
from __future__ import annotations

from typing import Any, Callable

from raytrain import events

LOSS, GRADIENTS = 1, 2  # bits of a rank's code


def describe(step: int, codes: list[int]) -> str:
    """``step 6 skipped: non-finite loss on rank 1`` from each rank's code (index = rank)."""
    loss = [r for r, c in enumerate(codes) if c & LOSS]
    if loss:  # reduced gradients are non-finite on every rank then: the loss names where it started
        return f"step {step} skipped: non-finite loss on {_ranks(loss)}"
    grads = [r for r, c in enumerate(codes) if c & GRADIENTS]
    if grads:
        return f"step {step} skipped: non-finite gradients on {_ranks(grads)}"
    return f"step {step} skipped: non-finite gradients (DeepSpeed's optimizer found a non-finite gradient norm)"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def innermost_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers that update the weights under DeepSpeed's wrappers (ZeRO, bf16, offload)."""
    chain, seen = [], set()
    node = optimizer
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        chain.append(node)
        node = getattr(node, "optimizer", None)
    inner = [chain[-1]] if chain else []
    backup = getattr(optimizer, "backup_optimizer", None)  # ZeRO-3 offload's sub-groups kept on the GPU
    if backup is not None:
        inner.append(backup)
    return inner


class _NoUpdate:
    """Within the block the given optimizers' ``step`` does nothing (their state and the weights stay)."""

    def __init__(self, optimizers: list[Any]):
        self.optimizers = optimizers
        self.saved: list[tuple[Any, bool, Any]] = []

    def __enter__(self) -> None:
        for opt in self.optimizers:
            own = vars(opt).get("step", None) if hasattr(opt, "__dict__") else None
            self.saved.append((opt, "step" in vars(opt), own))
            opt.step = lambda *a, **k: None

    def __exit__(self, *exc: Any) -> None:
        for opt, had, own in reversed(self.saved):
            if had:
                opt.step = own
            else:
                del opt.step


class StepGuard:
    """Installed on one engine; ``emit`` writes the skip event (rank 0)."""

    def __init__(self, engine: Any, *, rank: int, world_size: int, emit: Callable[..., None] = events.emit):
        import torch

        self.engine, self.rank, self.world_size, self.emit = engine, rank, world_size, emit
        self.device = getattr(engine, "device", None) or torch.device("cpu")
        self.skipped: list[dict] = []
        self._loss_flags: list[Any] = []
        zero = getattr(engine, "zero_optimization_stage", None)
        self.zero_stage = int(zero()) if callable(zero) else 0

    # -- noting (no host sync) ---------------------------------------------------------------------------
    def note_loss(self, loss: Any) -> None:
        import torch

        if isinstance(loss, torch.Tensor):
            self._loss_flags.append(~torch.isfinite(loss.detach()).all())
        elif loss is not None:
            import math

            self._loss_flags.append(torch.tensor(not math.isfinite(float(loss))))

    def gradients_bad(self) -> Any:
        """Without ZeRO: whether the module's (reduced) gradients are non-finite, as a 0-d tensor (or None)."""
        import torch

        if self.zero_stage:
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return None
        try:
            norms = torch._foreach_norm(grads)  # one fused pass on CUDA
        except (AttributeError, RuntimeError, TypeError):
            norms = [g.norm() for g in grads]
        return ~torch.isfinite(torch.stack([n.float() for n in norms])).all()

    def local_code(self) -> Any:
        """This rank's code as a 0-d tensor (LOSS | GRADIENTS bits); clears what was noted."""
        import torch

        code = torch.zeros((), dtype=torch.int32, device=self.device)
        pipe_loss = getattr(self.engine, "total_loss", None)  # a pipeline's last stage: this batch's losses
        if pipe_loss is not None:
            self.note_loss(pipe_loss)
        if self._loss_flags:
            code = code + torch.stack([f.to(self.device) for f in self._loss_flags]).any().to(torch.int32) * LOSS
        grads_bad = self.gradients_bad()
        if grads_bad is not None:
            code = code + grads_bad.to(self.device).to(torch.int32) * GRADIENTS
        self._loss_flags = []
        return code

    def agree(self) -> list[int]:
        """Every rank's code, the same list on every rank: one all-reduce of ``world_size`` ints."""
        import torch

        codes = torch.zeros(self.world_size, dtype=torch.int32, device=self.device)
        codes[self.rank] = self.local_code()
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(codes)
        return [int(c) for c in codes.tolist()]

    # -- installing --------------------------------------------------------------------------------------
    def install(self) -> "StepGuard":
        engine = self.engine
        backward, take_step = engine.backward, engine._take_model_step

        def guarded_backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
            self.note_loss(loss)
            return backward(loss, *args, **kwargs)

        def guarded_step(*args: Any, **kwargs: Any) -> Any:
            codes = self.agree()
            if any(codes):
                return self._skip(take_step, codes, *args, **kwargs)
            step = int(getattr(engine, "global_steps", 0)) + 1
            result = take_step(*args, **kwargs)
            if getattr(engine.optimizer, "overflow", False):  # ZeRO's own agreed skip: a non-finite norm
                self._record(step, codes)
            return result

        engine.backward = guarded_backward
        engine._take_model_step = guarded_step
        engine._raytrain_guard = self
        return self

    def _skip(self, take_step: Callable[..., Any], codes: list[int], *args: Any, **kwargs: Any) -> Any:
        engine = self.engine
        step = int(getattr(engine, "global_steps", 0)) + 1  # the number the step's report carries
        scheduler = engine.lr_scheduler
        skipped_before = engine.skipped_steps
        engine.lr_scheduler = None  # a skipped step does not advance the schedule (as DeepSpeed's own skip)
        try:
            with _NoUpdate(innermost_optimizers(engine.optimizer)):
                result = take_step(*args, **kwargs)
        finally:
            engine.lr_scheduler = scheduler
        engine.skipped_steps = skipped_before + 1  # once, whether or not DeepSpeed's own check also fired
        engine._step_applied = False
        self._record(step, codes)
        return result

    def _record(self, step: int, codes: list[int]) -> None:
        message = describe(step, codes)
        record = {"step": step, "message": message,
                  "ranks": {str(r): _what(c) for r, c in enumerate(codes) if c}}
        self.skipped.append(record)
        if self.rank == 0:
            self.emit(events.SKIPPED, **record)


def _what(code: int) -> str:
    return "loss" if code & LOSS else "gradients"


def install(engine: Any, *, rank: int | None = None, world_size: int | None = None) -> StepGuard | None:
    """The guard on ``engine`` (once); None for an object that is not a DeepSpeed engine."""
    if getattr(engine, "_raytrain_guard", None) is not None:
        return engine._raytrain_guard
    if not (hasattr(engine, "_take_model_step") and hasattr(engine, "module")):
        return None
    if rank is None or world_size is None:
        import torch.distributed as dist

        ready = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if ready else 0
        world_size = dist.get_world_size() if ready else 1
    return StepGuard(engine, rank=rank, world_size=world_size).install()


# -- honest endings ---------------------------------------------------------------------------------------
def _local_tensors(engine: Any) -> list[Any]:
    """This rank's share of the weights: ZeRO-3 keeps each parameter's partition in ``ds_tensor``."""
    module = getattr(engine, "module", engine)
    return [getattr(p, "ds_tensor", None) if getattr(p, "ds_tensor", None) is not None else p
            for p in module.parameters()]


def local_weights_finite(engine: Any) -> bool:
    import torch

    tensors = [t.detach() for t in _local_tensors(engine) if t is not None and t.numel()]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def agreed_flags(flags: list[bool], *, device: Any, world_size: int) -> list[bool]:
    """Each flag OR-ed over all ranks (one all-reduce); every rank must call it."""
    import torch

    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=device)
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def is_finite_number(value: Any) -> bool:
    import math

    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True  # not a number: nothing to judge


class NonFiniteRun(RuntimeError):
    """The run ended with a non-finite loss or non-finite weights: it did not succeed."""


def ending_problem(engine: Any, last_metrics: dict[str, Any], *, rank: int, world_size: int) -> str | None:
    """Why the run cannot end ``succeeded`` (the same answer on every rank), or None. Collective when an engine
    is given: every rank must call it."""
    loss = last_metrics.get("loss") if last_metrics else None
    loss_bad = rank == 0 and loss is not None and not is_finite_number(loss)
    if engine is None:
        return _ending_message(last_metrics, loss_bad, False)
    loss_bad, weights_bad = agreed_flags(
        [loss_bad, not local_weights_finite(engine)], device=getattr(engine, "device", "cpu"), world_size=world_size
    )
    return _ending_message(last_metrics, loss_bad, weights_bad)


def _ending_message(last: dict[str, Any], loss_bad: bool, weights_bad: bool) -> str | None:
    step = (last or {}).get("step")
    at = f" at step {step}" if step is not None else ""
    if loss_bad and weights_bad:
        return f"the run ended with a non-finite loss ({(last or {}).get('loss')}){at} and non-finite weights"
    if loss_bad:
        return f"the run ended with a non-finite loss ({(last or {}).get('loss')}){at}"
    if weights_bad:
        return f"the run ended with non-finite weights{at}"
    return None
