"""Rank 0's memory estimate for the exact model and config a job built (the planner's arithmetic), as an
event for the job summary. Advisory: a model the planner cannot read is logged, never fatal."""
from __future__ import annotations

from typing import Any, Callable

from raytrain import events
from raytrain.config.plan import Plan


def emit_estimate(
    model: Any, plan: Plan, *, world_size: int, log: Callable[..., None], zero_init: bool = False
) -> None:
    try:
        from raytrain.planner.memory import Layout, estimate
        from raytrain.planner.meta import count_parameters, count_trainable, largest_layer

        params, trainable = count_parameters(model), count_trainable(model)
        largest, _ = largest_layer(model)
        est = estimate(
            Layout(zero=plan.zero, offload=plan.offload, precision=plan.precision),
            params=params,
            largest_layer=largest,
            gpus=world_size,
            gpus_per_node=max(1, int(plan.scaling.num_workers)),
            trainable=trainable,
            zero_init=zero_init,
            grad_accum=plan.grad_accum,
        )
    except Exception as exc:  # the estimate is advisory; never fail training for it
        log(f"raytrain: no memory estimate ({type(exc).__name__}: {exc})")
        return
    events.emit(
        events.ESTIMATE,
        params=params,
        trainable=trainable,
        model_states=est.states.gpu_total,
        gpu_allocated=est.allocated,
        gpu_total=est.gpu_total,
        cpu_per_node=est.cpu_per_node,
    )
