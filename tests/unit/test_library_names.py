"""Every pynvml and DeepSpeed name raytrain (and bench/) reads exists in the installed versions.

The GPU paths cannot run here, and their unit tests use fakes built on the code's own idea of the library's
names: a misspelt or renamed name would pass those. So the names are read from the source (AST: string
constants and attributes that look like NVML names, attributes and ``getattr`` literals on a DeepSpeed
engine, ``deepspeed.a.b`` chains and ``from deepspeed... import``) and looked up in the real packages."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "raytrain").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])
NVML_NAME = re.compile(r"^(nvml[A-Z]\w*|NVML_[A-Z0-9_]+|NVMLError\w*)$")


def _trees():
    for path in SOURCES:
        yield path, ast.parse(path.read_text(), filename=str(path))


def nvml_names() -> dict[str, str]:
    """{name: where} for every string constant or attribute that is an NVML name."""
    found: dict[str, str] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            name = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else \
                node.attr if isinstance(node, ast.Attribute) else None
            if name and NVML_NAME.match(name):
                found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _is_engine(node: ast.AST) -> bool:
    """``engine``, ``self.engine``, ``ctx.engine``, ``self._engine``: a DeepSpeed engine by the code's naming."""
    if isinstance(node, ast.Name):
        return node.id in ("engine", "ds_engine")
    return isinstance(node, ast.Attribute) and node.attr in ("engine", "_engine")


def engine_names() -> dict[str, str]:
    found: dict[str, str] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and _is_engine(node.value) and not isinstance(node.ctx, ast.Store):
                name = node.attr  # read from DeepSpeed's engine (one raytrain sets itself is not DeepSpeed's)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and len(node.args) >= 2 and _is_engine(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
            if name and not name.startswith(("__", "_raytrain")):  # _raytrain*: raytrain's own, set on the engine
                found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def deepspeed_paths() -> dict[str, str]:
    """``deepspeed.zero.Init`` chains and ``from deepspeed.x import y`` as dotted paths."""
    found: dict[str, str] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "deepspeed":
                for alias in node.names:
                    found.setdefault(f"{node.module}.{alias.name}", f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.Attribute):
                parts, cur = [], node
                while isinstance(cur, ast.Attribute):
                    parts.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name) and cur.id == "deepspeed":
                    found.setdefault(".".join(["deepspeed", *reversed(parts)]), f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _has_instance_attr(cls: type, name: str) -> bool:
    """``name`` is a class attribute, or assigned as ``self.name = ...`` (or ``self.__dict__['name'] = ...``,
    how DeepSpeedEngine sets ``module``) in a class of the MRO."""
    if hasattr(cls, name):
        return True
    n = re.escape(name)
    pattern = re.compile(rf"\bself\.{n}\s*(:[^=]+)?=[^=]|\bself\.__dict__\[['\"]{n}['\"]\]\s*=[^=]")
    for klass in cls.__mro__:
        try:
            if pattern.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):
            continue
    return False


def test_the_scan_finds_what_the_code_reads():
    """The scanners themselves: names known to be read are found (an empty scan would pass everything)."""
    assert {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMemoryInfo", "NVML_CLOCK_MEM"} <= set(nvml_names())
    assert {"skipped_steps", "fp16_enabled", "global_steps", "save_checkpoint", "zero_optimization_stage"} <= set(engine_names())
    assert "deepspeed.initialize" in deepspeed_paths() and "deepspeed.zero.Init" in deepspeed_paths()


def test_every_pynvml_name_exists():
    import pynvml

    missing = {n: where for n, where in nvml_names().items() if not hasattr(pynvml, n)}
    assert not missing, f"names not in the installed nvidia-ml-py: {missing}"


def test_every_deepspeed_engine_attribute_exists():
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.pipe.engine import PipelineEngine

    missing = {n: where for n, where in engine_names().items()
               if not (_has_instance_attr(DeepSpeedEngine, n) or _has_instance_attr(PipelineEngine, n))}
    assert not missing, f"engine attributes not in the installed DeepSpeed: {missing}"


@pytest.mark.parametrize("cls", [
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3",
    "deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer",
    "deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer",
])
def test_fp16_optimizers_have_loss_scale(cls):
    """reporter.loss_scaling reads ``engine.optimizer.loss_scale`` on every fp16 optimizer DeepSpeed builds."""
    assert isinstance(inspect.getattr_static(resolve(cls), "loss_scale"), property)


def test_every_deepspeed_path_exists():
    missing = {}
    for dotted, where in deepspeed_paths().items():
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as exc:
            missing[dotted] = f"{where}: {exc}"
    assert not missing, f"DeepSpeed names not in the installed version: {missing}"
