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

    from raytrain.runtime.worker.engine import ensure_distributed

    ensure_distributed()
    layers = list(layers)
    if len(layers) < stages:
        raise PartitionError(f"--pp {stages}: the job gave {len(layers)} layers; a pipeline needs at least {stages}")
    module = PipelineModule(
        layers=layers,
        num_stages=stages,
        loss_fn=loss_fn,
        partition_method=partition_method,
        activation_checkpoint_interval=checkpoint_interval,
    )
    if stages > 1:
        count_every_stage_in_grad_norm(module)
    return module


def count_every_stage_in_grad_norm(module: Any) -> int:
    """Work around DeepSpeed 0.19's gradient clipping under pipeline parallel: its global norm counts a
    parameter only on model-parallel rank 0 or when the parameter is tagged model-parallel, and in the pipeline
    grid stage k reports model-parallel rank k, so every stage was scaled by stage 0's norm alone (--pp 2 then
    trains differently from --pp 1 whenever clipping acts). Tagging each stage's parameters ``model_parallel``
    makes every stage count its own gradients once. Sound only without tensor parallelism (raytrain refuses
    --tp with --pp) and without weights tied across stages (refused here). Returns the parameters tagged."""
    if getattr(module, "tied_modules", None):
        raise PartitionError(
            "--pp with weights tied across stages (TiedLayerSpec) is not supported: DeepSpeed's gradient clipping "
            "would count the tied weights on the wrong stages; untie them, or run with --grad-clip 0"
        )
    params = list(module.parameters())
    for p in params:
        p.model_parallel = True
    return len(params)
