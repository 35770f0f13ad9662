"""Elastic training: ``--workers MIN-MAX``.

Ray Train starts with as many workers as the cluster holds (up to MAX) and, after a lost node, restarts the
group with the workers that remain (at least MIN). raytrain keeps the global batch fixed across sizes by
changing gradient accumulation: train_batch = micro-batch x grad-accum x data-parallel size, so every
size in the range must divide the global batch. Pure functions: used by config resolution and, with the
real world size, by the worker runtime.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from raytrain.config.checks import check_int
from raytrain.config.options import DEFAULTS
from raytrain.errors import ConfigError

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
ELASTIC_MAX_FAILURES = 3  # --workers MIN-MAX without --max-failures: restarts allowed after lost workers


def parse_workers(value: Any) -> tuple[int, int]:
    """``--workers`` as (min, max): ``4`` -> (4, 4); ``"2-4"`` -> (2, 4)."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        lo = hi = value
    else:
        m = _RANGE.match(str(value))
        if not m:
            raise ConfigError(
                f"--workers {value!r}: use a number of workers (4) or an elastic range MIN-MAX (2-4)",
                flag="--workers",
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
    if lo < 1:
        raise ConfigError(f"--workers {value}: must be >= 1 (at least one worker)", flag="--workers")
    if hi < lo:
        raise ConfigError(f"--workers {value}: MIN is larger than MAX; write it as {hi}-{lo}", flag="--workers")
    return lo, hi


def accum_for(train_batch: int, micro: int, dp: int) -> int | None:
    """Gradient-accumulation steps that keep ``train_batch`` at data-parallel size ``dp`` (None: impossible)."""
    if dp < 1 or train_batch % (micro * dp):
        return None
    return train_batch // (micro * dp)


def rescale(ds: dict[str, Any], *, train_batch: int, dp: int) -> tuple[dict[str, Any], int]:
    """The DeepSpeed dict for data-parallel size ``dp`` with the global batch kept; returns (dict, accum)."""
    micro = int(ds["train_micro_batch_size_per_gpu"])
    accum = accum_for(train_batch, micro, dp)
    if accum is None:
        raise ValueError(f"global batch {train_batch} is not divisible by micro-batch {micro} x {dp} workers")
    out = copy.deepcopy(ds)
    out["gradient_accumulation_steps"] = accum
    if "train_batch_size" in out:
        out["train_batch_size"] = train_batch
    return out, accum


def max_failures_for(given: int | None, lo: int, hi: int) -> int:
    """--max-failures: an elastic range (lo < hi) restarts by default and refuses 0."""
    elastic = lo < hi
    if elastic and given is None:
        return ELASTIC_MAX_FAILURES  # elastic means "continue after a lost worker"
    value = check_int("max_failures", given or DEFAULTS["max_failures"], -1)
    if elastic and value == 0:
        raise ConfigError(
            f"--workers {lo}-{hi} with --max-failures 0: an elastic job continues after a lost "
            "worker by restarting the group; allow restarts (--max-failures N, or leave it unset)",
            flag="--max-failures",
        )
    return value

def check_elastic(lo: int, hi: int, *, mode: str, tp: int, pp: int) -> None:
    """An elastic range needs a train(ctx) job and data parallelism only."""
    if lo == hi:
        return
    if mode == "script":
        raise ConfigError(
            f"--workers {lo}-{hi}: elastic training needs a train(ctx) job (raytrain restores and "
            "reshards its checkpoints when the worker count changes); this file runs in script mode",
            flag="--workers",
        )
    if tp * pp > 1:
        raise ConfigError(
            f"--workers {lo}-{hi}: elastic training works with data parallelism only (Ray Train "
            f"may pick any size in the range); with --tp {tp} --pp {pp} give a fixed --workers",
            flag="--workers",
        )
