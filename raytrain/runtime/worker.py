"""What every Ray Train worker runs: import the job file, build ``ctx``, call ``train(ctx)`` (or, in script
mode, run the file as ``__main__``: raytrain.runtime.script)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


def find_job_file(relative: str) -> Path:
    """The job file in the unpacked working_dir. Ray puts working_dir on sys.path; Ray Train v2 moves the
    worker's cwd elsewhere (the run's artifact folder), so look on sys.path, then in the cwd."""
    for entry in [*sys.path, os.getcwd()]:
        candidate = Path(entry or ".") / relative
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"raytrain: job file {relative} is not in the job's working_dir (searched sys.path)")


def load_job(relative: str) -> Any:
    """Import the job file (as module ``raytrain_job``); its folder goes on sys.path for sibling imports."""
    path = find_job_file(relative)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("raytrain_job", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["raytrain_job"] = module
    spec.loader.exec_module(module)
    return module


def train_loop_per_worker(config: dict[str, Any]) -> None:
    plan = config["plan"]
    import warnings

    import ray.train

    from raytrain import timings

    rank = ray.train.get_context().get_world_rank()
    timings.emit("worker_process", timings.process_start_time(), rank=rank)
    timings.emit("train_fn", rank=rank)

    # DeepSpeed's ZeRO calls torch.distributed APIs that torch 2.13 deprecates, once per step: noise the
    # user cannot act on.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    if not plan["scaling"]["use_gpu"]:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    else:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import deepspeed  # noqa: F401  (what every job needs; timed on its own)
    import torch  # noqa: F401

    timings.emit("imports", rank=rank)
    if plan.get("mode", "train") == "script":  # an unmodified deepspeed/torchrun script, run as __main__
        from raytrain.runtime.script import run_on_worker

        return run_on_worker(plan)
    from raytrain.runtime.context import make_context

    module = load_job(plan["job_module"])
    ctx = make_context(plan, restore_from=restore_point(config), checkpoint_every=plan.get("checkpoint_every") or 0)
    module.train(ctx)
    ctx.finish()


def restore_point(config: dict[str, Any]) -> str | None:
    """The checkpoint to continue from: Ray Train's latest (after a worker-group restart) or --resume's."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return config.get("resume_from")
    if type(checkpoint.filesystem).__name__ == "LocalFileSystem":
        return checkpoint.path
    return checkpoint.to_directory()  # remote storage (s3://, gs://): download this worker's copy
