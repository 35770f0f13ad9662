"""The workers import torch and DeepSpeed in the background from the moment their process starts (the
``early_imports`` tuning; the imports themselves: raytrain.runtime.worker.early_imports).

Ray runs a worker process's setup hook as soon as the process has connected. A job-level
``runtime_env["worker_process_setup_hook"]`` becomes Ray's private variable below at ``ray.init`` only; Ray
Train's workers are actors with a runtime env of their own, which must carry the variable itself.
"""
from __future__ import annotations

import importlib

from raytrain import ray_tuning

SETUP_HOOK_VAR_MODULE, SETUP_HOOK_VAR_NAME = "ray._private.ray_constants", "WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


def setup_hook_env_var() -> str | None:
    """The name of Ray's worker-setup-hook variable; None where this Ray does not have it."""
    try:
        module = importlib.import_module(SETUP_HOOK_VAR_MODULE)
    except ImportError:
        return None
    value = getattr(module, SETUP_HOOK_VAR_NAME, None)
    return value if isinstance(value, str) and value else None


def setup_hook_env(hook: str) -> dict[str, str]:
    """The env var that makes a worker process run ``hook`` (``module.function``) as it starts; {} where the
    tuning is off."""
    if not ray_tuning.on("early_imports"):
        return {}
    name = setup_hook_env_var()
    return {name: hook} if name else {}
