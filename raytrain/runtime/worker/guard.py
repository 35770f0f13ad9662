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
- under ZeRO 1-3 where that skip is known to happen (``zero_skips_non_finite``), without a spike rule and not
  in a pipeline, there is no per-step all-reduce at all: ``backward`` is given ``loss x (0 x loss + 1)``, the
  same loss and the same gradients when the loss is finite, NaN gradients on this rank when it is not (even
  where the loss's gradients would be finite), which the gradients' reduction carries to every rank, so
  DeepSpeed's optimizer skips the step everywhere. Only on a step it skipped does every rank join one
  all-reduce of its loss code, which names the rank. Elsewhere under ZeRO (an older DeepSpeed that does not
  check, a spike rule) the all-reduce starts asynchronously at the boundary's ``backward`` and is over by
  the step;
- a bad step runs DeepSpeed's own ``_take_model_step`` with the innermost torch optimizer's ``step`` made a
  no-op and no LR scheduler step: the gradients are cleared the way each layout clears them, the weights and
  the optimizer state stay as they were, ``global_steps`` counts the step and ``skipped_steps`` counts the skip
  (what DeepSpeed's own overflow skip leaves).

A per-gradient check as each gradient is computed would name the rank of a gradient-only problem, but costs a
pass over every gradient per micro-batch; the loss names the rank in the common case (a bad sample).

``train(ctx)`` jobs add (``configure``): the dataset rows of the step in the skip message (what the rank's
``ctx.dataset`` iterators handed out since the previous optimizer step, gathered from every rank only on a bad
step), ``--spike-guard`` (:class:`SpikeRule` on the step's loss averaged over all ranks, carried in the same
all-reduce) and ``--rollback-after K`` (after K bad steps in a row, ``on_rollback`` ends the worker group with
``runtime.worker.rollback.Rollback``).

The guard is installed on every engine raytrain builds (``ctx.deepspeed``, ``ctx.pipeline``, script mode's
``deepspeed.initialize``).
"""
from __future__ import annotations

from typing import Any, Callable

from raytrain import events

LOSS, GRADIENTS = 1, 2  # bits of a rank's code


def describe(step: int, codes: list[int], rows: dict[int, dict[str, list[int]]] | None = None,
             spike: str | None = None) -> str:
    """``step 6 skipped: non-finite loss on rank 1 (rows 1234, 1235)`` from each rank's code (index = rank) and,
    when the data came from ``ctx.dataset``, each rank's rows of the step ({rank: {dataset: row ids}})."""
    loss = [r for r, c in enumerate(codes) if c & LOSS]
    grads = [r for r, c in enumerate(codes) if c & GRADIENTS]
    if loss:  # reduced gradients are non-finite on every rank then: the loss names where it started
        text, named = f"step {step} skipped: non-finite loss on {_ranks(loss)}", loss
    elif grads:
        text, named = f"step {step} skipped: non-finite gradients on {_ranks(grads)}", grads
    elif spike:
        text, named = f"step {step} skipped: {spike}", list(range(len(codes)))
    else:
        text = f"step {step} skipped: non-finite gradients (DeepSpeed's optimizer found a non-finite gradient norm)"
        named = list(range(len(codes)))
    said = _rows_text({r: (rows or {}).get(r) or {} for r in named})
    return f"{text} ({said})" if said else text


MAX_ROWS_SAID = 8


def _rows_text(rows: dict[int, dict[str, list[int]]]) -> str:
    """``rows 1234, 1235`` (one dataset) or ``train rows 1, 2; eval rows 7``; at most MAX_ROWS_SAID ids each."""
    by_name: dict[str, list[int]] = {}
    for rank in sorted(rows):
        for name, ids in rows[rank].items():
            by_name.setdefault(name, []).extend(int(i) for i in ids)
    parts = []
    for name, ids in by_name.items():
        ids = sorted(set(ids))
        if not ids:
            continue
        shown = ", ".join(map(str, ids[:MAX_ROWS_SAID]))
        more = f" and {len(ids) - MAX_ROWS_SAID} more" if len(ids) > MAX_ROWS_SAID else ""
        parts.append(("rows " if len(by_name) == 1 else f"{name} rows ") + shown + more)
    return "; ".join(parts)


class SpikeRule:
    """``--spike-guard``: a step whose loss (averaged over all ranks) is above ``mean + SIGMAS x std`` of the
    last ``WINDOW`` good steps' losses is a spike, once ``WARMUP`` good steps are in. ``std`` is floored at
    ``FLOOR x |mean|``, so that a nearly constant loss does not make noise a spike. Only steps that were not
    skipped enter the window; every rank computes the same verdict from the same all-reduced numbers."""

    WINDOW, WARMUP, SIGMAS, FLOOR = 50, 20, 6.0, 0.01

    def __init__(self, losses: list[float] | None = None):
        from collections import deque

        self.losses: Any = deque((float(x) for x in losses or []), maxlen=self.WINDOW)

    def check(self, loss: float) -> str | None:
        """Why ``loss`` is a spike (the words of the skip message), or None."""
        import math

        n = len(self.losses)
        if n < self.WARMUP or not math.isfinite(loss):
            return None
        mean = sum(self.losses) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.losses) / n)
        limit = mean + self.SIGMAS * max(std, self.FLOOR * abs(mean))
        if loss <= limit:
            return None
        return (f"loss spike {loss:.4g} (above {limit:.4g}: mean {mean:.4g} + {self.SIGMAS:g} x std {std:.4g} "
                f"of the last {n} good steps)")

    def add(self, loss: float) -> None:
        self.losses.append(float(loss))


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
        self._losses: list[Any] = []  # the (detached) loss tensors noted since the last step
        self._loss_bad = False  # a non-tensor loss noted since the last step was non-finite
        self._loss_sum: Any = None  # with a spike rule: the losses noted this step, summed (a tensor), and how many
        self._loss_count = 0
        self.last_loss: float | None = None  # the step's loss averaged over the ranks that computed one
        self.spike: SpikeRule | None = None
        self.rows: Callable[[], list[tuple[str, int, list[int]]]] | None = None  # (dataset, epoch, ids) of the step
        self.rollback_after = 0
        self.on_rollback: Callable[[list[dict]], None] | None = None
        self.bad_run: list[dict] = []  # the bad steps in a row so far (each with every rank's rows)
        zero = getattr(engine, "zero_optimization_stage", None)
        self.zero_stage = int(zero()) if callable(zero) else 0
        self._pending: Any = None  # (codes, work): the step's all-reduce launch_early started
        pipeline = hasattr(engine, "train_batch")
        # no per-step collective: ZeRO's own agreed skip decides, a bad loss poisons the gradients (module doc)
        self._by_overflow = (self.zero_stage >= 1 and not pipeline
                             and zero_skips_non_finite(getattr(engine, "optimizer", None)))
        self._early = self.zero_stage >= 1 and not pipeline and not self._by_overflow  # configure: spike rule

    def configure(self, *, spike: SpikeRule | None = None, rows: Callable[[], list] | None = None,
                  rollback_after: int = 0, on_rollback: Callable[[list[dict]], None] | None = None) -> "StepGuard":
        """A ``train(ctx)`` job's additions (see the module doc)."""
        self.spike, self.rows, self.rollback_after, self.on_rollback = spike, rows, int(rollback_after), on_rollback
        if spike is not None:  # the rule needs every step's losses, all-reduced; as means, not merged with late ones
            self._by_overflow = self._early = False
        return self

    # -- noting (no host sync) ---------------------------------------------------------------------------
    def note_loss(self, loss: Any) -> None:
        import torch

        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
            self._losses.append(loss)  # checked once at the step (local_code): no tensor op per micro-batch
            if self.spike is not None:
                value = loss.float().mean()
                self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
                self._loss_count += 1
        elif loss is not None:
            import math

            if not math.isfinite(float(loss)):
                self._loss_bad = True
            if self.spike is not None:
                value = torch.tensor(float(loss))
                self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
                self._loss_count += 1

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
        """This rank's code as a 0-d int32 tensor (LOSS | GRADIENTS bits); clears what was noted."""
        import torch

        pipe_loss = getattr(self.engine, "total_loss", None)  # a pipeline's last stage: this batch's losses
        if pipe_loss is not None:
            self.note_loss(pipe_loss)
        losses, self._losses = self._losses, []
        bad = None  # a bool tensor: a noted loss is non-finite
        if losses:
            flat = losses[0] if len(losses) == 1 else torch.cat([t.reshape(-1).to(self.device) for t in losses])
            bad = torch.isfinite(flat).all().logical_not()
        if self._loss_bad:
            bad, self._loss_bad = torch.ones((), dtype=torch.bool), False
        code = (bad.to(self.device, torch.int32) * LOSS if bad is not None
                else torch.zeros((), dtype=torch.int32, device=self.device))
        grads_bad = self.gradients_bad()
        if grads_bad is not None:
            code = code + grads_bad.to(self.device, torch.int32) * GRADIENTS
        return code

    def _codes(self) -> Any:
        """This rank's slots of the all-reduced vector (see ``agree``); clears what was noted."""
        import torch

        n = self.world_size
        if self.spike is None:
            codes = torch.zeros(n, dtype=torch.int32, device=self.device)
            codes[self.rank] = self.local_code()
        else:
            codes = torch.zeros(3 * n, dtype=torch.float64, device=self.device)
            codes[self.rank] = self.local_code().to(torch.float64)  # notes a pipeline's loss first
            if self._loss_count:
                codes[n + self.rank] = self._loss_sum.to(self.device, torch.float64) / self._loss_count
                codes[2 * n + self.rank] = 1.0
            self._loss_sum, self._loss_count = None, 0
        return codes

    def launch_early(self) -> None:
        """At the accumulation boundary's ``backward``, before it runs: start the step's all-reduce now, so that
        it completes while the backward computes instead of adding a round trip before the optimizer step. Only
        where the verdict needs nothing the backward makes: under ZeRO 1-3 (ZeRO's optimizer checks the
        gradients itself), no spike rule, not a pipeline, more than one rank. Every rank takes the same path
        (the same engine config and the same calls), so the collectives stay matched."""
        if self._pending is not None or not self._early or self.world_size < 2:
            return
        boundary = getattr(self.engine, "is_gradient_accumulation_boundary", None)
        if not callable(boundary) or not boundary():
            return
        import torch.distributed as dist

        codes = self._codes()
        self._pending = (codes, dist.all_reduce(codes, async_op=True))

    def agree(self) -> list[int]:
        """Every rank's code, the same list on every rank: one all-reduce of ``world_size`` ints (with a spike
        rule: of ``3 x world_size`` floats, which also carry each rank's loss, so ``last_loss`` is agreed); the
        one ``launch_early`` started, if any."""
        n = self.world_size
        pending, self._pending = self._pending, None
        if pending is not None:
            codes, work = pending
            work.wait()
            if self._losses or self._loss_bad:  # a loss noted after the launch (another backward before the step)
                import torch.distributed as dist

                late = self._codes()
                dist.all_reduce(late)
                codes = codes | late
        else:
            codes = self._codes()
            if n > 1:
                import torch.distributed as dist

                dist.all_reduce(codes)
        values = codes.tolist()
        if self.spike is not None:
            have = sum(values[2 * n:])
            self.last_loss = sum(values[n:2 * n]) / have if have else None
        return [int(c) for c in values[:n]]

    def step_rows(self) -> list[tuple[str, int, list[int]]]:
        """This rank's dataset rows of the step (and forget them): nothing without ``ctx.dataset``."""
        return self.rows() if self.rows is not None else []

    def gather_rows(self, mine: list[tuple[str, int, list[int]]]) -> list[list[tuple[str, int, list[int]]]]:
        """Every rank's rows of the step (index = rank); every rank must call it (only on a bad step)."""
        if self.world_size == 1 or self.rows is None:
            return [mine] * self.world_size if self.rows is not None else [[] for _ in range(self.world_size)]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine)
        return [list(o or []) for o in out]

    # -- installing --------------------------------------------------------------------------------------
    def install(self) -> "StepGuard":
        engine = self.engine
        backward, take_step = engine.backward, engine._take_model_step

        def guarded_backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
            self.note_loss(loss)
            if self._by_overflow:
                return backward(poisoned(loss), *args, **kwargs)
            self.launch_early()
            return backward(loss, *args, **kwargs)

        def guarded_step(*args: Any, **kwargs: Any) -> Any:
            if self._by_overflow:
                return self._step_by_overflow(take_step, *args, **kwargs)
            codes = self.agree()
            rows = self.step_rows()
            spike = None
            if self.spike is not None and not any(codes) and self.last_loss is not None:
                spike = self.spike.check(self.last_loss)
            if any(codes) or spike:
                return self._skip(take_step, codes, rows, spike, *args, **kwargs)
            step = int(getattr(engine, "global_steps", 0)) + 1
            result = take_step(*args, **kwargs)
            if getattr(engine.optimizer, "overflow", False):  # ZeRO's own agreed skip: a non-finite norm
                self._record(step, codes, rows)
            else:
                self.bad_run = []
                if self.spike is not None and self.last_loss is not None:
                    self.spike.add(self.last_loss)
            return result

        engine.backward = guarded_backward
        engine._take_model_step = guarded_step
        engine._raytrain_guard = self
        return self

    def _step_by_overflow(self, take_step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """DeepSpeed's ZeRO optimizer decides (agreed on every rank); on a step it skipped, one all-reduce of the
        loss codes says whose loss it was (every rank skipped it, so every rank joins)."""
        engine = self.engine
        rows = self.step_rows()
        step = int(getattr(engine, "global_steps", 0)) + 1
        result = take_step(*args, **kwargs)
        if getattr(engine.optimizer, "overflow", False):
            self._record(step, self.agree(), rows)
        else:
            self._losses, self._loss_bad = [], False  # checked only on a skipped step
            self.bad_run = []
        return result

    def _skip(self, take_step: Callable[..., Any], codes: list[int], rows: list, spike: str | None,
              *args: Any, **kwargs: Any) -> Any:
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
        self._record(step, codes, rows, spike)
        return result

    def _loss_scale_overflow(self, codes: list[int], spike: str | None) -> bool:
        """Under fp16, a skip for non-finite gradients alone (the loss finite): a loss-scale overflow."""
        return not spike and not any(c & LOSS for c in codes) and _fp16(self.engine)

    def _record(self, step: int, codes: list[int], rows: list, spike: str | None = None) -> None:
        every = self.gather_rows(rows)  # a collective: every rank records the same bad step
        by_rank = {r: _by_name(every[r]) for r in range(len(every))}
        message = describe(step, codes, by_rank, spike)
        record = {"step": step, "message": message,
                  "ranks": {str(r): _what(c) for r, c in enumerate(codes) if c}}
        if spike:
            record["spike"] = self.last_loss
        if any(by_rank.values()):
            record["rows"] = {str(r): ids for r, ids in by_rank.items() if ids}
        self.skipped.append(record)
        if self.rank == 0:
            self.emit(events.SKIPPED, **record)
        if self._loss_scale_overflow(codes, spike):
            return  # fp16's dynamic loss scale finds its level by such skips: they are not a run going bad
        # every rank's rows by (dataset, epoch): what a rollback drops on the way forward, on every rank alike
        self.bad_run.append({"step": step, "message": message, "rows": _by_epoch(every)})
        if self.rollback_after and len(self.bad_run) >= self.rollback_after and self.on_rollback is not None:
            run, self.bad_run = self.bad_run, []
            self.on_rollback(run)


def poisoned(loss: Any) -> Any:
    """``loss x (0 x loss + 1)``: for a finite loss the same value and, bit for bit, the same gradients (x 1);
    for a non-finite one NaN, and NaN gradients however the loss became non-finite. Two tensor ops and one
    more in the backward, no host sync."""
    import torch

    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return loss
    return loss * loss.detach().mul(0).add_(1)


def zero_skips_non_finite(optimizer: Any) -> bool:
    """Whether this ZeRO optimizer's step skips a step with non-finite gradients on every rank alike (sets
    ``overflow``). DeepSpeed 0.19.8 checks the global norm (ZeRO-1/2 outside bf16 where it computes it, ZeRO-3,
    the bf16 optimizer); fp16 and ZeRO-1/2's ``check_grad_overflow`` (bf16's default; deepspeed_compat turns
    it on under 0.18) test the gradients; deepspeed_compat adds that test to 0.18's ZeRO-3. Releases between
    check nothing outside fp16 and bf16: False there, and the guard keeps its per-step all-reduce."""
    import sys

    import torch

    if optimizer is None or not hasattr(optimizer, "overflow"):
        return False
    if getattr(optimizer, "check_grad_overflow", False) or getattr(optimizer, "_raytrain_checks_overflow", False):
        return True
    dtype = getattr(optimizer, "dtype", None)
    if dtype == torch.float16:  # the loss scaler's overflow test
        return True
    module = sys.modules.get(type(optimizer).__module__)
    if module is None or not hasattr(module, "is_invalid_grad_norm"):
        return False
    if hasattr(optimizer, "check_grad_overflow"):  # ZeRO-1/2: the norm is checked where computed, not in bf16
        return bool(getattr(optimizer, "compute_grad_norm", True)) and dtype not in (None, torch.bfloat16)
    return True


def _fp16(engine: Any) -> bool:
    enabled = getattr(engine, "fp16_enabled", None)
    try:
        return bool(enabled()) if callable(enabled) else False
    except Exception:  # noqa: BLE001
        return False


def _what(code: int) -> str:
    return "loss" if code & LOSS else "gradients"


def _by_name(rows: list[tuple[str, int, list[int]]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, _epoch, ids in rows:
        out.setdefault(name, []).extend(int(i) for i in ids)
    return out


def _by_epoch(every: list[list[tuple[str, int, list[int]]]]) -> dict[str, dict[str, list[int]]]:
    """{dataset: {epoch (a str: JSON keys): sorted row ids}} over all ranks."""
    out: dict[str, dict[str, set]] = {}
    for rows in every:
        for name, epoch, ids in rows:
            out.setdefault(name, {}).setdefault(str(int(epoch)), set()).update(int(i) for i in ids)
    return {name: {e: sorted(ids) for e, ids in epochs.items()} for name, epochs in out.items()}


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
    # A sum is one read of each tensor (isfinite also writes a mask and reads it again: several times slower,
    # and every checkpoint pays it on the training thread); NaN and inf carry through a sum. A sum that
    # overflows from finite values is told apart by the exact check.
    floats = [t for t in tensors if t.is_floating_point()]
    if floats and bool(torch.stack([t.sum(dtype=torch.float32) if t.element_size() < 4 else t.sum()
                                    for t in floats]).isfinite().all()):
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
