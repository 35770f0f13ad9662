"""The code's shape, checked (issue 14): no import cycles, the control plane never imports the worker runtime,
the CLI starts without torch/deepspeed/ray, and config/, targets/, clusters/ keep functions short.

Imports are read from the source (AST), including imports inside functions, so a cycle cannot hide there.
An edge is a module a file names; a package's ``__init__`` that re-exports its submodules (raytrain.config,
raytrain.planner) is a facade no submodule imports back.
"""
import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PKG = ROOT / "raytrain"
CONTROL_PLANE = ("cli", "config", "targets", "clusters", "planner", "checkpoints", "api", "status", "events",
                 "timings", "capacity", "storage", "paths", "errors", "nvml")
SHORT_FUNCTIONS = ("config", "targets", "clusters")
MAX_LINES = 60


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != name and n.startswith("raytrain"):
                found.add(n)
    # "from raytrain.config import options" names the submodule: keep the most specific module only
    return {n for n in found if not any(o.startswith(n + ".") for o in found)} | (found & {"raytrain"})


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles_of(g: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_one_that_imports_it_back():
    assert cycles_of(graph()) == []


# Which part of the package may import which. A part is a subpackage (cli, config, ...) or a top-level module;
# every top-level module but api is a shared leaf (errors, events, paths, settings, ...).
UPPER = {"cli", "api", "targets", "clusters", "runtime"}
MAY_NOT_IMPORT = {
    "cli": {"runtime"},
    "api": {"cli", "runtime"},
    "targets": {"cli", "api", "runtime"},
    "clusters": {"cli", "api", "targets", "runtime"},
    "runtime": {"cli", "api", "targets", "clusters"},
    "ray_tuning": UPPER,  # imported by clusters/, targets/ and runtime/: only the shared leaves below it
    "config": UPPER, "planner": UPPER, "checkpoints": UPPER,
}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "raytrain"


def part_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in g.items():
        out.setdefault(part_of(a), set()).update(part_of(b) for b in targets if part_of(b) != part_of(a))
    return out


def test_packages_import_only_down_the_matrix_and_never_in_a_cycle():
    parts = part_graph(graph())
    assert cycles_of(parts) == []
    wrong = sorted(f"{a} -> {b}" for a, bs in parts.items() for b in bs
                   if b in MAY_NOT_IMPORT.get(a, UPPER if a not in MAY_NOT_IMPORT and a != "raytrain" else ()))
    assert not wrong, wrong


def test_the_matrix_check_sees_a_package_cycle():
    g = {"raytrain.clusters.local": {"raytrain.targets.local"}, "raytrain.targets.local": {"raytrain.clusters.x"},
         "raytrain.clusters.x": set()}
    assert cycles_of(part_graph(g)) == [["clusters", "targets"]]


def test_the_control_plane_never_imports_the_worker_runtime():
    bad = {
        name: sorted(d for d in deps if d.startswith("raytrain.runtime"))
        for name, deps in graph().items()
        if name.split(".")[1:2] and name.split(".")[1] in CONTROL_PLANE
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_cli_starts_without_torch_deepspeed_or_ray():
    # nor the Hugging Face packages (raytrain[hf]): only the workers that run an HF script import them
    heavy = "('torch', 'deepspeed', 'ray', 'transformers', 'accelerate', 'peft', 'safetensors')"
    code = f"import sys, raytrain.cli.main; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_functions_in_config_targets_clusters_stay_short_or_say_why():
    long = []
    for folder in SHORT_FUNCTIONS:
        for path in (PKG / folder).rglob("*.py"):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    head = "\n".join(lines[node.lineno - 2: node.lineno + 3])
                    if length > MAX_LINES and "long:" not in head:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert long == [], "functions over 60 lines need a '# long: reason' comment next to the def"


HARD_LIMIT = 80


def long_functions(root: Path, limit: int) -> list[str]:
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    long.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return long


def test_no_function_in_the_package_is_over_80_lines():
    """Not even with a '# long:' reason: a function that long is several steps, each worth a name."""
    assert long_functions(PKG, HARD_LIMIT) == []


def test_the_length_check_sees_a_long_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n    pass\n")
    assert long_functions(pkg, HARD_LIMIT) == ["pkg/m.py:1 f (81 lines)"]


def test_only_the_worker_runtime_imports_deepspeed():
    importers = sorted(
        str(path.relative_to(ROOT)) for path in PKG.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "deepspeed" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deepspeed" and not node.level)
    )
    assert importers and all(p.startswith("raytrain/runtime/") for p in importers), importers


PRIVATE_RAY = ("ray._private", "_internal")  # issue 39's grep: `grep -rn "ray._private\|_internal" raytrain/`


def test_ray_internals_are_used_only_inside_the_ray_tuning_package():
    """Every use of a Ray private module (and every mention of one) lives in raytrain/ray_tuning, where each
    tuning has its version gate and contract test; the rest of raytrain uses Ray's public APIs only."""
    import re

    pattern = re.compile(r"ray._private|_internal")  # the grep, its "." matching any character
    outside = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in PKG.rglob("*.py") if "ray_tuning" not in path.relative_to(PKG).parts
        for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)
    ]
    assert outside == [], "Ray internals outside raytrain/ray_tuning:\n" + "\n".join(outside)


def test_the_ray_tuning_package_imports_only_shared_leaves():
    """raytrain.ray_tuning is imported by clusters/, runtime/ and targets/, so it imports none of them."""
    g = graph()
    wrong = sorted(f"{a} -> {b}" for a, bs in g.items() if part_of(a) == "ray_tuning"
                   for b in bs if part_of(b) in UPPER)
    assert wrong == [], wrong


def test_the_private_ray_check_sees_a_use_outside_the_package(tmp_path):
    import re

    pattern = re.compile(r"ray._private|_internal")
    assert pattern.search("from ray._private import services")
    assert pattern.search("from ray.train.v2._internal.util import x")
    assert not pattern.search("from ray.train import Checkpoint")
