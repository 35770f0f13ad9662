"""Ray Train's torch backend (process group setup and teardown) without importing torch where no training runs.

``ray.train.torch.TorchTrainer`` and ``TorchConfig`` live in a module that imports torch at its top, so the
driver (which builds the trainer) and Ray Train's controller (which unpickles the backend config) each spend
a full torch import (~2 CPU seconds on these CPUs, ~5 s of wall time on a busy 2-core node) before a worker
is even placed: two serial steps on the path from the command to step 1. This backend does what
``_TorchBackend`` does for CPU and GPU jobs (gloo/nccl, ``env://`` rendezvous, torchrun's environment
variables, the same teardown) but names Ray's torch helpers by module path, so they are imported only on the
workers, which need torch anyway. raytrain's preflight (``preflight.run``) runs first, as before.

``RAYTRAIN_LAZY_TORCH=0`` uses Ray's ``TorchTrainer``/``TorchConfig`` (with the same preflight) instead;
``bench/start_time.py`` measures the difference.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from raytrain import settings

RAY_TORCH = "ray.train.torch.config"  # where Ray's worker-side torch helpers live (imports torch)
SHUTDOWN_TIMEOUT_S = 30.0


def lazy_torch_enabled() -> bool:
    return settings.get("RAYTRAIN_LAZY_TORCH")


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """On a worker: ``ray.train.torch.config.<name>(*args, **kwargs)`` (the import happens here, or has happened
    in the worker's background imports: raytrain.runtime.early_imports)."""
    from raytrain.runtime import early_imports

    early_imports.wait()
    return getattr(importlib.import_module(RAY_TORCH), name)(*args, **kwargs)


def set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class TorchContext:
    """Ray's ``TorchConfigContextManager`` (sets the CUDA device around the train function), imported on the
    worker when the train function starts."""

    def __enter__(self):
        self._inner = call("TorchConfigContextManager")
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


def process_group_backend(configured: str | None, resources_per_worker: dict) -> str:
    """gloo on CPU workers, nccl on GPU workers, unless the config names one (Ray's choice, without TPUs)."""
    if configured:
        return configured
    return "nccl" if float(resources_per_worker.get("GPU", 0) or 0) > 0 else "gloo"


def make_config(*, timeout_s: float, interface: str | None) -> Any:
    """A torch-free BackendConfig for Ray Train's DataParallelTrainer: preflight, then the process group."""
    import ray
    from ray.train._internal.utils import get_address_and_port
    from ray.train.backend import Backend, BackendConfig
    from ray.train.v2._internal.util import TrainingFramework

    from raytrain import timings
    from raytrain.runtime import preflight

    class LazyTorchBackend(Backend):
        share_cuda_visible_devices = True

        def on_start(self, worker_group, backend_config):
            preflight.before_process_group(worker_group, backend_config.interface)
            backend = process_group_backend(backend_config.backend, worker_group.get_resources_per_worker())
            addr, port = worker_group.execute_single(0, get_address_and_port)
            worker_group.execute(set_master, addr, port)
            worker_group.execute(call, "_set_torch_distributed_env_vars")
            ray.get([
                worker_group.execute_single_async(
                    rank, call, "_setup_torch_process_group", backend=backend, world_rank=rank,
                    world_size=len(worker_group), init_method="env://", timeout_s=backend_config.timeout_s,
                )
                for rank in range(len(worker_group))
            ])
            timings.emit("process_group")

        def on_shutdown(self, worker_group, backend_config):
            refs = worker_group.execute_async(call, "_shutdown_torch", destroy_process_group=len(worker_group) > 1)
            try:
                ray.get(refs, timeout=SHUTDOWN_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                pass  # Ray's backend only logs this too

    @dataclass
    class LazyTorchConfig(BackendConfig):
        backend: str | None = None
        timeout_s: int = 1800
        interface: str | None = None

        @property
        def backend_cls(self):
            return LazyTorchBackend

        @property
        def train_func_context(self):
            return TorchContext

        @property
        def framework(self):
            return TrainingFramework.TORCH

        def to_dict(self) -> dict[str, Any]:
            return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}

    return LazyTorchConfig(timeout_s=int(timeout_s), interface=interface)


# Ray Train's default callbacks that raytrain's jobs do without, each one more actor process (a Python start
# on the node, in the seconds before step 1) and worker round trips:
# - DatasetsCallback: a DatasetManager actor and Ray Data's context sent to every worker, also for a trainer
#   given no datasets (raytrain never gives one: ``--data`` streams through its own Feeder actor);
# - PlacementGroupCleanerCallback, where RAYTRAIN_PG_CLEANER=0 (the local target sets it): a detached actor per
#   run that removes the workers' placement group if the controller dies; on the local cluster the driver
#   removes the groups an ended job leaked before it places its own (runtime/placement_watch.py).
# ``RAYTRAIN_LEAN_TRAINER=0`` keeps them all (bench/start_time.py measures what dropping them buys).
def dropped_callbacks(datasets: dict | None) -> set[str]:
    if not settings.get("RAYTRAIN_LEAN_TRAINER"):
        return set()
    names = set() if datasets else {"DatasetsCallback"}
    if not settings.get("RAYTRAIN_PG_CLEANER"):
        names.add("PlacementGroupCleanerCallback")
    return names


# Ray Train's scaling policy of a fixed-size run registers the run's resources with the AutoscalingCoordinator,
# a detached actor shared by Ray Train and Ray Data, before it places the workers (a blocking call) and every
# 20 s. The first run after a cluster starts creates that actor: one more Python process start on the path to
# step 1, which then stays on the node for good, its main thread waking 100 times a second. A node raytrain
# runs itself has no autoscaler to tell: where RAYTRAIN_AUTOSCALING_COORDINATOR=0 (the local target sets it)
# the fixed policy does without it. An elastic run (--workers MIN-MAX) keeps it: it sizes itself by the
# resources the coordinator reserves.
def coordinator_enabled() -> bool:
    return settings.get("RAYTRAIN_AUTOSCALING_COORDINATOR")


_NO_COORDINATOR: list[type] = []


def without_coordinator(policy: Any) -> Any:
    """A fixed scaling policy that makes the same decisions and never calls the AutoscalingCoordinator;
    any other policy unchanged."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    if type(policy) is not FixedScalingPolicy:
        return policy
    if not _NO_COORDINATOR:
        class FixedScalingPolicyWithoutCoordinator(FixedScalingPolicy):
            # No coordinator client is ever made, so the base class's cancel on shutdown is a no-op.
            def after_controller_start(self, train_run_context):
                self._requester_id = f"train-{train_run_context.run_id}"

            def _maybe_send_resource_request(self):
                pass

        _NO_COORDINATOR.append(FixedScalingPolicyWithoutCoordinator)
    return _NO_COORDINATOR[0](policy.scaling_config)


_LEAN: list[type] = []


def lean_trainer_class() -> type:
    """DataParallelTrainer less the default callbacks ``dropped_callbacks`` names and, where
    ``coordinator_enabled`` says so, a fixed-size run's calls to the AutoscalingCoordinator."""
    if not _LEAN:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        class LeanDataParallelTrainer(DataParallelTrainer):
            def _create_default_callbacks(self):
                drop = dropped_callbacks(self.datasets)
                return [c for c in super()._create_default_callbacks() if type(c).__name__ not in drop]

            def _initialize_and_run_controller(self, **controller_init_kwargs):
                if not coordinator_enabled() and "scaling_policy" in controller_init_kwargs:
                    controller_init_kwargs["scaling_policy"] = without_coordinator(
                        controller_init_kwargs["scaling_policy"])
                return super()._initialize_and_run_controller(**controller_init_kwargs)

        _LEAN.append(LeanDataParallelTrainer)
    return _LEAN[0]


def trainer(train_fn, *, backend_config_args: dict, **kwargs: Any) -> Any:
    """Ray Train's trainer for raytrain's workers: DataParallelTrainer with the torch-free backend (less the
    callbacks raytrain does without), or (with ``RAYTRAIN_LAZY_TORCH=0``) Ray's TorchTrainer with its own
    backend; both run the preflight first."""
    if lazy_torch_enabled():
        return lean_trainer_class()(train_fn, backend_config=make_config(**backend_config_args), **kwargs)
    from ray.train.torch import TorchTrainer

    from raytrain.runtime.preflight import torch_config

    return TorchTrainer(train_fn, torch_config=torch_config(**backend_config_args), **kwargs)
