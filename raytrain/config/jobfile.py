"""Check a job file without importing it (the CLI never runs user code or imports torch)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from raytrain.errors import ConfigError


@dataclass(frozen=True)
class JobFile:
    path: Path  # absolute path on the submitting machine
    directory: Path  # shipped to the cluster as the runtime_env working_dir
    relative: str  # the file's path inside ``directory``, as workers import it
    uses_pipeline: bool = False  # calls ctx.pipeline(...): it hands raytrain its layers
    declares_tp_spec: bool = False  # defines a module-level TP_SPEC


def check_job_file(path: str | None) -> JobFile:
    """The job file, if it exists, parses and defines ``train(ctx)`` at module level."""
    if not path:
        raise ConfigError("no job file given: raytrain submit JOB.py [options]", flag="JOB")
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"job file {path}: no such file", flag="JOB")
    if p.suffix != ".py":
        raise ConfigError(f"job file {path}: expected a Python file (.py) that defines train(ctx)", flag="JOB")
    source = p.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source, filename=str(p))
    except SyntaxError as exc:
        raise ConfigError(
            f"job file {path}: syntax error at line {exc.lineno}: {exc.msg}", flag="JOB"
        ) from exc
    train = next(
        (
            node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "train"
        ),
        None,
    )
    if train is None:
        raise ConfigError(
            f"job file {path}: defines no train(ctx) function at module level; "
            "raytrain calls train(ctx) on every worker",
            flag="JOB",
        )
    args = train.args
    positional = len(args.posonlyargs) + len(args.args)
    if positional < 1 and args.vararg is None:
        raise ConfigError(
            f"job file {path}: train() takes no argument; define it as train(ctx)", flag="JOB"
        )
    uses_pipeline = any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pipeline"
        for node in ast.walk(tree)
    )
    declares_tp_spec = any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TP_SPEC" for t in node.targets)
        for node in tree.body
    )
    resolved = p.resolve()
    return JobFile(
        path=resolved, directory=resolved.parent, relative=resolved.name,
        uses_pipeline=uses_pipeline, declares_tp_spec=declares_tp_spec,
    )
