"""DeepSpeed engine construction: the one place that imports deepspeed."""
from __future__ import annotations

from typing import Any

from raytrain import settings


def _skip_shm_comm_on_cpu(deepspeed: Any) -> None:
    """Skip DeepSpeed's shared-memory allreduce op on CPU workers.

    Every CPU ``deepspeed.initialize`` otherwise compiles ``deepspeed_shm_comm`` on first use (minutes on
    a small machine); training never uses it (it serves inference all-reduce). Set
    ``RAYTRAIN_DS_SHM_COMM=1`` to keep it.
    """
    if settings.get("RAYTRAIN_DS_SHM_COMM"):
        return
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def ensure_distributed() -> None:
    """DeepSpeed's comm layer over the process group Ray Train made (gloo on CPU, NCCL on GPU)."""
    import deepspeed

    _skip_shm_comm_on_cpu(deepspeed)
    deepspeed.init_distributed()  # reuses an initialised torch.distributed group


def build_engine(model: Any, *, optimizer: Any, config: dict, lr_scheduler: Any, model_parameters: Any, **kwargs: Any):
    import deepspeed

    ensure_distributed()
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        config=config,
        **kwargs,
    )
    from raytrain.runtime.worker import deepspeed_compat, guard

    deepspeed_compat.fix_engine(engine)  # an older DeepSpeed's known defects (a no-op on 0.19)
    guard.install(engine)  # a non-finite loss or gradient on any rank: the step is skipped on every rank
    return engine


def _device(offload_config: Any) -> str | None:
    """An offload config's device ('cpu', 'nvme'): an enum or its value, as DeepSpeed's pydantic gives it."""
    device = getattr(offload_config, "device", None)
    return None if device is None else str(getattr(device, "value", device))


def engine_facts(engine: Any) -> dict:
    """What DeepSpeed actually built, read from the engine and its optimizer (not from the config raytrain
    gave it): a flag lost on the way shows here. ``zero_stage``, ``offload_optimizer`` / ``offload_param``
    (the device, or None where the built optimizer does not offload), ``precision``, ``optimizer`` (the
    wrapper's class), ``micro_batch``, ``grad_accum``, ``train_batch``, ``dp``, ``tp`` (the tensor-parallel
    group's size, 1 without tensor-parallel layers), ``tp_layers`` (Linear layers DeepSpeed split), ``pp``
    (pipeline stages), ``pipeline_checkpoint_interval`` (pipeline activation checkpointing; None off a
    pipeline)."""
    from deepspeed.module_inject.layers import TensorParallel_Layer
    from deepspeed.runtime.pipe.engine import PipelineEngine

    optimizer = engine.optimizer
    offload_cfg, param_cfg = engine.zero_offload_optimizer(), engine.zero_offload_param()
    # stage 1/2's optimizer says cpu_offload, stage 3's offload_optimizer / offload_param
    offloads = bool(getattr(optimizer, "cpu_offload", False) or getattr(optimizer, "offload_optimizer", False))
    offloads_param = bool(getattr(optimizer, "offload_param", False))
    tp_layers = sum(isinstance(m, TensorParallel_Layer) for m in engine.module.modules())
    tp = 1
    if tp_layers:
        from deepspeed.utils import groups

        tp = int(groups.get_tensor_model_parallel_world_size())
    pipe = isinstance(engine, PipelineEngine)
    return {
        "zero_stage": int(engine.zero_optimization_stage()),
        "offload_optimizer": _device(offload_cfg) if offloads else None,
        "offload_param": _device(param_cfg) if offloads_param else None,
        "precision": "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32",
        "optimizer": type(optimizer).__name__,
        "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
        "grad_accum": int(engine.gradient_accumulation_steps()),
        "train_batch": int(engine.train_batch_size()),
        "dp": int(engine.dp_world_size),
        "tp": tp,
        "tp_layers": tp_layers,
        "pp": int(engine.num_stages) if pipe else 1,
        "pipeline_checkpoint_interval": int(engine.module.activation_checkpoint_interval) if pipe else None,
    }
