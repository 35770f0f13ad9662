"""Import DeepSpeed on a worker without the optional packages it pulls in for features raytrain never uses."""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

# deepspeed.autotuning.autotuner runs `import mlflow` when DeepSpeed is imported, to log autotuning
# experiments (raytrain never runs DeepSpeed's autotuner). Where mlflow is installed (raytrain[track] puts
# it there) that import brings pandas, sqlalchemy, opentelemetry...: about 1.5 s of CPU on every worker of
# every job before its first step, more than the rest of `import deepspeed`.
UNUSED_BY_DEEPSPEED = ("mlflow",)


def import_hiding(module: str, hidden: tuple[str, ...]) -> ModuleType:
    """``import module`` while each of ``hidden`` looks absent (an ImportError, which optional imports
    expect); afterwards they import normally again. A module already imported is left alone."""
    if module in sys.modules:
        return sys.modules[module]
    masked = [name for name in hidden if name not in sys.modules]
    for name in masked:
        sys.modules[name] = None  # type: ignore[assignment]  # Python's own "import fails" marker
    try:
        return importlib.import_module(module)
    finally:
        for name in masked:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


def import_deepspeed() -> ModuleType:
    hidden = UNUSED_BY_DEEPSPEED if os.environ.get("RAYTRAIN_HIDE_UNUSED_IMPORTS", "1") != "0" else ()
    return import_hiding("deepspeed", hidden)  # RAYTRAIN_HIDE_UNUSED_IMPORTS=0: as DeepSpeed does (bench/)
