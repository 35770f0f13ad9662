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
    from raytrain.runtime import guard

    guard.install(engine)  # a non-finite loss or gradient on any rank: the step is skipped on every rank
    return engine
