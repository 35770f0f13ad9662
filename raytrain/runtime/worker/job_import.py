"""The user's file on a worker: found in the unpacked working_dir and imported as module ``raytrain_job``."""
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
