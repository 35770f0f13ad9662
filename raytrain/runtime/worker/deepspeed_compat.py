"""What raytrain does differently on an older DeepSpeed release it supports (docs/compatibility.md).

DeepSpeed 0.18.x: the ZeRO-1/2 optimizer flattens the model's parameters into one buffer per group without
detaching it, so the buffer and its per-rank partitions carry autograd history (0.19 detaches it). On CPU
workers gloo's all-gather of the updated partitions writes into views of that buffer and every optimizer
step fails with "Output 0 of Split is a view and is being modified inplace" (NCCL writes through a raw
pointer and should not meet it). :func:`fix_engine` detaches those buffers once, after
``deepspeed.initialize``: the same storage, so the parameters, partitions and buffer stay linked as
DeepSpeed set them up, exactly what 0.19 builds.

DeepSpeed 0.18.x also applies a step whose gradients are non-finite under ZeRO-1/2/3 in fp32 and bf16 (it
checks them only for fp16's loss scaling), so the weights turn NaN; 0.19 skips such a
step on every rank, and raytrain's non-finite guard (guard.py) counts on that skip under ZeRO.
:func:`fix_engine` turns on the 0.18 optimizer's own check (its all-reduced overflow test, which fp16 uses)
where 0.19 makes one.
"""
from __future__ import annotations

import re
from typing import Any

# (flat buffers, their per-rank partitions) attribute names: ZeRO-1/2's optimizer, and the BF16 optimizer,
# which builds its buffers the same way
_FLAT_BUFFERS = (("bit16_groups_flat", "parallel_partitioned_bit16_groups"),
                 ("bf16_groups_flat", "bf16_partitioned_groups"))


def version_tuple(version: str) -> tuple[int, int]:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def needs_fixes(version: str) -> bool:
    """DeepSpeed releases before 0.19, which need the fixes above."""
    return version_tuple(version) < (0, 19)


def fix_engine(engine: Any, version: str | None = None) -> list[str]:
    """Apply the fixes ``version`` (default: the installed DeepSpeed's; unknown: none) needs to ``engine``;
    returns what it changed (empty where nothing was needed)."""
    if version is None:
        import deepspeed

        version = getattr(deepspeed, "__version__", None)
    if not version or not needs_fixes(version):
        return []
    optimizer = getattr(engine, "optimizer", None)
    done = []
    if _detach_flat_buffers(optimizer):
        done.append("detached flat buffers")
    if _check_non_finite_gradients(optimizer):
        done.append("non-finite gradient check")
    return done


def _detach_flat_buffers(optimizer: Any) -> int:
    fixed = 0
    for flat_name, parts_name in _FLAT_BUFFERS:
        flats, parts = getattr(optimizer, flat_name, None), getattr(optimizer, parts_name, None)
        if not isinstance(flats, list) or not isinstance(parts, list):
            continue
        for i, flat in enumerate(flats):
            if getattr(flat, "requires_grad", False):
                flats[i] = flat.detach()  # same storage: the parameters still point into it
                fixed += 1
        for i, group in enumerate(parts):
            if isinstance(group, list):
                parts[i] = [p.detach() if getattr(p, "requires_grad", False) else p for p in group]
    return fixed


def _check_non_finite_gradients(optimizer: Any) -> bool:
    """Make a 0.18 ZeRO optimizer skip a step with non-finite gradients, as 0.19 does (fp16 is checked
    already)."""
    import torch

    dtype = getattr(optimizer, "dtype", None)
    if hasattr(optimizer, "check_grad_overflow") and hasattr(optimizer, "check_overflow"):  # ZeRO-1/2
        if optimizer.check_grad_overflow:
            return False
        optimizer.check_grad_overflow = True  # its step() then runs check_overflow() and skips on overflow
        return True
    update = getattr(optimizer, "_overflow_check_and_loss_scale_update", None)
    if update is None or not hasattr(optimizer, "check_overflow") or dtype == torch.float16:
        return False  # not ZeRO-3, or fp16, which 0.18 already checks

    def check_then_update(*args: Any, **kwargs: Any) -> Any:
        optimizer.check_overflow()  # sets optimizer.overflow (all-reduced), which ``update`` acts on
        return update(*args, **kwargs)

    optimizer._overflow_check_and_loss_scale_update = check_then_update
    optimizer._raytrain_checks_overflow = True  # guard.zero_skips_non_finite reads it
    return True
