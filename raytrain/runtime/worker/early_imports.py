"""Import torch and DeepSpeed on a Ray Train worker while it waits, not after.

From a worker process's start to the train function, Ray Train's controller waits for the other workers to
start, polls them, runs the preflight and forms the process group; only then did the worker import torch (in
the process group setup) and DeepSpeed (in the train function), one after the other on the path to step 1.
The driver gives the workers (and only them: Ray Train's ``worker_runtime_env``) Ray's
worker process setup hook = ``start``, which imports ``$RAYTRAIN_WORKER_IMPORTS`` (e.g.
``torch,deepspeed``) in a background thread from the moment the process has connected to Ray.

Thread safety: Python's per-module import locks make a second ``import torch`` wait for the first to finish,
so the worker never sees a half-imported module; still, raytrain's code calls ``wait()`` before its own first
torch/DeepSpeed import (the process group setup, the train function), so the two threads never import the
same package at once. A failed import here is ignored: the train function imports again and reports the error
as before. Giving the workers the hook is a Ray tuning (raytrain.ray_tuning.early_imports): with it off the
workers import torch and DeepSpeed when the train function starts.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import threading
import time
from typing import Any, Iterator

from raytrain import settings

MODULES_ENV = "RAYTRAIN_WORKER_IMPORTS"  # comma-separated, set by the driver on the workers' runtime env
GPU_ENV = "RAYTRAIN_WORKER_GPU"  # "1": the workers use GPUs (DeepSpeed picks its accelerator at import)
HOOK = f"{__name__}.start"

_thread: threading.Thread | None = None
_done_at: list[float] = []  # when the background imports ended (time.time())


def omp_threads(cpus_per_worker: float | None) -> str:
    """Ray's own rule for a worker's ``OMP_NUM_THREADS``: the floor of its CPUs, at least 1."""
    return str(max(int(math.floor(cpus_per_worker or 1)), 1))


def worker_runtime_env(modules: list[str], use_gpu: bool, cpus_per_worker: float | None = 1,
                       job_env: Any = ()) -> dict:
    """Ray Train's ``worker_runtime_env``: the hook and what it imports (merged over the job's runtime env).

    It also carries ``OMP_NUM_THREADS``. Ray sets it (to the worker's CPUs) in the worker's ``os.environ``
    when the actor's first task runs, but the hook imports torch before that, and libgomp reads the variable
    once, when it loads: without it every worker's torch ran one OpenMP thread per core of the machine (2
    workers x 2 threads on 2 cores, the extra threads spinning at the barriers). A job's own ``--env
    OMP_NUM_THREADS`` (``job_env``: the names the job's ``--env`` sets) is left to the job's runtime env."""
    from raytrain.ray_tuning.early_imports import setup_hook_env

    hook = setup_hook_env(HOOK) if modules else {}
    if not hook:
        return {}
    env = {**hook, MODULES_ENV: ",".join(modules), GPU_ENV: "1" if use_gpu else "0"}
    if "OMP_NUM_THREADS" not in job_env:
        env["OMP_NUM_THREADS"] = omp_threads(cpus_per_worker)
    return {"env_vars": env}


def prepare_environment(use_gpu: bool) -> None:
    """What must be set before torch/DeepSpeed import on a worker (the user's own --env wins)."""
    if use_gpu:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _import_all(modules: list[str]) -> None:
    from raytrain.runtime.worker.deepspeed_imports import import_deepspeed

    with collector_paused():
        for name in modules:
            try:
                import_deepspeed() if name == "deepspeed" else importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the train function imports it again and reports the error
                return
    _done_at.append(time.time())


def start() -> None:
    """Ray's worker_process_setup_hook: start the imports in a daemon thread and return at once."""
    global _thread
    modules = [m for m in settings.get(MODULES_ENV).split(",") if m]
    if not modules or _thread is not None:
        return
    prepare_environment(settings.get(GPU_ENV))
    _thread = threading.Thread(target=_import_all, args=(modules,), daemon=True, name="raytrain-imports")
    _thread.start()


def match_torch_threads() -> int | None:
    """torch's intra-op threads set to ``OMP_NUM_THREADS`` (what the runtime env, or Ray for the task, says),
    should torch have been loaded before the variable was set; the count, or None when no count is set."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    want = int(value) if value.isdigit() else 0
    if want < 1:
        return None
    import torch

    if torch.get_num_threads() != want:
        torch.set_num_threads(want)
    return want


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Import with Python's cyclic garbage collector off, then freeze what the process holds.

    A worker process holds ~300,000 objects once Ray, torch and DeepSpeed are imported, all of which live as
    long as the process. The collector walked them again and again: about five full collections in the
    imports (0.03-0.18 s each) and two more in the engine build and step 1 (0.15-0.19 s each). Off during the
    imports and ``gc.freeze()`` after (what Python's documentation advises for a heap that lives for good),
    the job's own collections walk only what the job makes: importing Ray Train, torch and DeepSpeed took 2.2
    s instead of 2.8 s in one process. Garbage made by the imports stays (9,000 objects left unreachable
    there, against 600,000 kept)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def wait() -> float | None:
    """Block until the background imports are done (at once when none were started); when they ended, if
    they all succeeded."""
    if _thread is not None:
        _thread.join()
    return _done_at[0] if _done_at else None
