"""Ray Train's torch backend (process group setup and teardown) without importing torch where no training runs
(the ``lazy_torch`` tuning).

``ray.train.torch.TorchTrainer`` and ``TorchConfig`` live in a module that imports torch at its top, so the
driver (which builds the trainer) and Ray Train's controller (which unpickles the backend config) each spend
a full torch import before a worker is even placed (docs/benchmarks.md). This backend does what Ray's
``_TorchBackend`` does for CPU and GPU jobs (gloo/nccl, ``env://`` rendezvous, torchrun's environment
variables, the same teardown) by calling Ray's private worker-side helpers by name, so torch is imported only
on the workers. raytrain's preflight runs first (``before_process_group``), as with Ray's backend.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

RAY_TORCH = "ray.train.torch.config"  # where Ray's worker-side torch helpers live (imports torch)
# Ray's private functions of RAY_TORCH this backend calls on the workers (the contract test checks them)
HELPERS = ("_set_torch_distributed_env_vars", "_setup_torch_process_group", "_shutdown_torch",
           "TorchConfigContextManager")
SHUTDOWN_TIMEOUT_S = 30.0


def call(prepare: Callable[[], Any] | None, name: str, *args: Any, **kwargs: Any) -> Any:
    """On a worker: ``prepare()`` (e.g. wait for the background imports), then
    ``ray.train.torch.config.<name>(*args, **kwargs)``."""
    if prepare is not None:
        prepare()
    return getattr(importlib.import_module(RAY_TORCH), name)(*args, **kwargs)


def set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


def process_group_backend(configured: str | None, resources_per_worker: dict) -> str:
    """gloo on CPU workers, nccl on GPU workers, unless the config names one (Ray's choice, without TPUs)."""
    if configured:
        return configured
    return "nccl" if float(resources_per_worker.get("GPU", 0) or 0) > 0 else "gloo"


def torch_framework() -> Any:
    """Ray Train's tag for a torch run (its state export reads it); None where this Ray has none."""
    try:
        from ray.train.v2._internal.util import TrainingFramework
    except ImportError:
        return None
    return getattr(TrainingFramework, "TORCH", None)


def make_config(*, timeout_s: float, interface: str | None,
                before_process_group: Callable[[Any, str | None], None],
                prepare: Callable[[], Any] | None = None) -> Any:
    """A torch-free BackendConfig for Ray Train's DataParallelTrainer: ``before_process_group(worker_group,
    interface)`` on the controller, then the process group; ``prepare`` runs on each worker before its first
    torch import."""
    import ray
    from ray.train.backend import Backend, BackendConfig

    from raytrain import timings
    from raytrain.ray_tuning.ray_access import address_and_port

    class TorchContext:
        """Ray's ``TorchConfigContextManager`` (sets the CUDA device around the train function), imported on
        the worker when the train function starts."""

        def __enter__(self):
            self._inner = call(prepare, "TorchConfigContextManager")
            return self._inner.__enter__()

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

    class LazyTorchBackend(Backend):
        share_cuda_visible_devices = True

        def on_start(self, worker_group, backend_config):
            before_process_group(worker_group, backend_config.interface)
            backend = process_group_backend(backend_config.backend, worker_group.get_resources_per_worker())
            addr, port = worker_group.execute_single(0, address_and_port)
            worker_group.execute(set_master, addr, port)
            worker_group.execute(call, prepare, "_set_torch_distributed_env_vars")
            ray.get([
                worker_group.execute_single_async(
                    rank, call, prepare, "_setup_torch_process_group", backend=backend, world_rank=rank,
                    world_size=len(worker_group), init_method="env://", timeout_s=backend_config.timeout_s,
                )
                for rank in range(len(worker_group))
            ])
            timings.emit("process_group")

        def on_shutdown(self, worker_group, backend_config):
            refs = worker_group.execute_async(call, prepare, "_shutdown_torch",
                                              destroy_process_group=len(worker_group) > 1)
            try:
                ray.get(refs, timeout=SHUTDOWN_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                pass  # Ray's backend only logs this too

    framework = torch_framework()

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
            return framework

        def to_dict(self) -> dict[str, Any]:
            return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}

    return LazyTorchConfig(timeout_s=int(timeout_s), interface=interface)
