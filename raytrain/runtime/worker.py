"""What every Ray Train worker runs: import the job file, build ``ctx``, call ``train(ctx)``."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


def load_job(relative: str) -> Any:
    """Import the job file from the worker's working_dir (Ray sets the cwd to the unpacked job folder)."""
    cwd = Path.cwd()
    path = cwd / relative
    if not path.is_file():
        raise FileNotFoundError(f"raytrain: job file {relative} not found in working_dir {cwd}")
    if str(cwd) not in sys.path:
        sys.path.insert(0, str(cwd))  # the job may import its sibling modules
    spec = importlib.util.spec_from_file_location("raytrain_job", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["raytrain_job"] = module
    spec.loader.exec_module(module)
    return module


def train_loop_per_worker(config: dict[str, Any]) -> None:
    plan = config["plan"]
    if not plan["scaling"]["use_gpu"]:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    else:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    from raytrain.runtime.context import make_context

    module = load_job(plan["job_module"])
    ctx = make_context(plan)
    module.train(ctx)
