"""Tensor and pipeline partitioning on the worker: the AutoTP spec into the engine's config (checked with
raytrain.planner.partition) and PipelineModule building."""
from __future__ import annotations

import sys
from typing import Any

from raytrain.planner.partition import PartitionError, check_tp, choose_spec


def prepare_tensor_parallel(model: Any, config: dict[str, Any], tp: int, log: Any) -> None:
    """Choose the AutoTP partition spec (--tp-spec, the job's TP_SPEC, or derived from layer names) into
    ``config`` and refuse a split the model cannot take, before DeepSpeed touches the weights."""
    tp_cfg = config.setdefault("tensor_parallel", {})
    job_spec = getattr(sys.modules.get("raytrain_job"), "TP_SPEC", None)
    spec = tp_cfg["partition_config"] = choose_spec(tp_cfg.get("partition_config"), job_spec)
    roles = check_tp(model, spec, tp)
    log(f"raytrain: tensor parallel {tp}: splitting {len(roles)} Linear layers "
        f"({sum(r == 'column' for r in roles.values())} column, {sum(r == 'row' for r in roles.values())} row)")


def build_pipeline(layers: Any, *, stages: int, loss_fn: Any, partition_method: str, checkpoint_interval: int):
    from deepspeed.pipe import PipelineModule

    from raytrain.runtime.engine import ensure_distributed

    ensure_distributed()
    layers = list(layers)
    if len(layers) < stages:
        raise PartitionError(f"--pp {stages}: the job gave {len(layers)} layers; a pipeline needs at least {stages}")
    return PipelineModule(
        layers=layers,
        num_stages=stages,
        loss_fn=loss_fn,
        partition_method=partition_method,
        activation_checkpoint_interval=checkpoint_interval,
    )
