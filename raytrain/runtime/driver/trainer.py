"""Which Ray Train trainer runs raytrain's workers.

With the ``lazy_torch`` tuning (raytrain.ray_tuning.lazy_torch): Ray Train's DataParallelTrainer with a
torch-free backend (and, with ``lean_trainer``, less the callbacks raytrain does without). Without it
(``RAYTRAIN_RAY_TUNING=off``, or a Ray the tuning was not written for): Ray's own ``TorchTrainer`` with a
``TorchConfig`` whose backend runs raytrain's preflight first. Both run the preflight before the process group.
"""
from __future__ import annotations

from typing import Any


def trainer(train_fn, *, backend_config_args: dict, local_cluster: bool | None = None, **kwargs: Any) -> Any:
    """Ray Train's trainer for raytrain's workers (see the module's docstring); ``local_cluster``: the plan's
    (raytrain's own local cluster: the lean trainer leaves out more)."""
    from raytrain import ray_tuning
    from raytrain.runtime.worker import early_imports
    from raytrain.runtime.driver import preflight

    if ray_tuning.on("lazy_torch"):
        from raytrain.ray_tuning import lazy_torch

        config = lazy_torch.make_config(**backend_config_args, before_process_group=preflight.before_process_group,
                                        prepare=early_imports.wait)
        if ray_tuning.on("lean_trainer"):
            from raytrain.ray_tuning.lean_trainer import lean_trainer_class

            return lean_trainer_class()(train_fn, backend_config=config, local_cluster=local_cluster, **kwargs)
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return DataParallelTrainer(train_fn, backend_config=config, **kwargs)
    from ray.train.torch import TorchTrainer

    return TorchTrainer(train_fn, torch_config=preflight.torch_config(**backend_config_args), **kwargs)
