"""Import DeepSpeed on a worker without paying for features raytrain never uses.

Two costs DeepSpeed 0.19 puts before every job's first step, on every worker (CPU seconds on 2 cores):
- ``deepspeed.autotuning.autotuner`` runs ``import mlflow`` to log autotuning experiments. Where mlflow is
  installed (raytrain[track] puts it there), that brings pandas, sqlalchemy, opentelemetry: ~1.8 s.
- The ZeRO optimizers import DeepSpeed's Muon module for an ``isinstance`` check, and that module decorates
  three functions with ``torch.compile`` when it is imported; building those wrappers loads TorchInductor:
  ~2.2 s. raytrain makes the decoration lazy: ``torch.compile(fn)`` is built on the first call, which only
  a job that really uses Muon makes (torch.compile itself compiles on the first call anyway).
  On DeepSpeed 0.18 ``import deepspeed`` itself imports the Muon module, so this saving is lost there.
"""
from __future__ import annotations

import functools
import importlib
import sys
from types import ModuleType
from typing import Callable

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


def compile_on_first_call() -> Callable[[Callable], Callable]:
    """A stand-in for ``deepspeed.runtime.compiler.compile()``: a decorator that builds ``torch.compile(fn)``
    when the function is first called, not when its module is imported."""

    def decorate(fn: Callable) -> Callable:
        compiled: list[Callable] = []

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not compiled:
                import torch

                compiled.append(torch.compile(fn))
            return compiled[0](*args, **kwargs)

        return call

    return decorate


def import_deepspeed() -> ModuleType:
    deepspeed = import_hiding("deepspeed", UNUSED_BY_DEEPSPEED)
    from deepspeed.runtime import compiler

    if "deepspeed.runtime.zero.muon.original_muon" not in sys.modules:  # not decorated yet
        compiler.compile = compile_on_first_call
    return deepspeed
