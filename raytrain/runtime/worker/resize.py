"""Elastic runs (``--workers MIN-MAX``, data parallel only) on a worker: Ray Train chose the world size; keep
the global batch by changing gradient accumulation, and say so when the run is smaller than planned or
grew back from a smaller checkpoint."""
from __future__ import annotations

from typing import Any

from raytrain import events
from raytrain.config.elastic import rescale
from raytrain.config.plan import Plan


def fit_to_world_size(
    plan: Plan, config: dict[str, Any], *, world_size: int, rank: int, saved_world_size: int | None
) -> tuple[dict[str, Any], int, dict[str, int]]:
    """(DeepSpeed config, gradient accumulation, parallel sizes) for ``world_size`` workers: the plan's own
    unless the run is elastic."""
    grad_accum = config["gradient_accumulation_steps"]
    scaling = plan.scaling
    if scaling.min_workers is None:
        return config, grad_accum, plan.parallel
    config, fitted_accum = rescale(config, train_batch=plan.train_batch, dp=world_size)
    if rank == 0 and (world_size != scaling.num_workers or saved_world_size not in (None, world_size)):
        events.emit(
            events.RESIZED,
            workers=world_size,
            range=f"{scaling.min_workers}-{scaling.num_workers}",
            planned_workers=scaling.num_workers,
            grad_accum=fitted_accum,
            planned_grad_accum=grad_accum,
            train_batch=plan.train_batch,
        )
    return config, fitted_accum, {"dp": world_size, "tp": 1, "pp": 1}
