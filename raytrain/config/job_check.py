"""Check a job file without importing it (the CLI never runs user code or imports torch)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from raytrain.config.hf_trainer import is_trainer_script
from raytrain.errors import ConfigError


@dataclass(frozen=True)
class JobFile:
    path: Path  # absolute path on the submitting machine
    directory: Path  # shipped to the cluster as the runtime_env working_dir
    relative: str  # the file's path inside ``directory``, as workers import it
    uses_pipeline: bool = False  # calls ctx.pipeline(...): it hands raytrain its layers
    declares_tp_spec: bool = False  # defines a module-level TP_SPEC
    mode: str = "train"  # "train": raytrain calls train(ctx); "script": run as __main__ (script mode)
    mode_reason: str = ""  # why this mode was chosen, for the CLI's one line
    hf_trainer: bool = False  # script mode: uses Hugging Face TrainingArguments (raytrain.config.hf_trainer)


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _module_level_code(tree: ast.Module) -> int | None:
    """The line of the first module-level statement that runs code on import (a call such as ``main()`` or
    ``dist.init_process_group(...)``, or a loop/with block), or None. Imports, definitions and
    assignments do not count: a job file may have those."""
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Call, ast.Await)):
            return node.lineno
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            return node.lineno
    return None


def _parse(path: str | None) -> tuple[Path, ast.Module]:
    """The job file's path and syntax tree, or a ConfigError naming JOB."""
    if not path:
        raise ConfigError("no job file given: raytrain submit JOB.py [options]", flag="JOB")
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"job file {path}: no such file", flag="JOB")
    if p.suffix != ".py":
        raise ConfigError(f"job file {path}: expected a Python file (.py) that defines train(ctx)", flag="JOB")
    source = p.read_text(encoding="utf-8", errors="replace")
    try:
        return p, ast.parse(source, filename=str(p))
    except SyntaxError as exc:
        raise ConfigError(
            f"job file {path}: syntax error at line {exc.lineno}: {exc.msg}", flag="JOB"
        ) from exc


def _mode(path: str, tree: ast.Module, script: bool | None) -> tuple[str, str]:
    """(mode, why): "train" or "script" (see check_job_file)."""
    train = next(
        (
            node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "train"
        ),
        None,
    )
    main_guard = any(_is_main_guard(node) for node in tree.body)
    code_line = _module_level_code(tree)
    takes_ctx = False
    first_param = None
    if train is not None:
        args = train.args
        params = [*args.posonlyargs, *args.args]
        takes_ctx = bool(params) or args.vararg is not None
        first_param = params[0].arg if params else None
    if script is True:
        return "script", "--script"
    if script is not False and (main_guard or code_line) and not (takes_ctx and first_param == "ctx"):
        what = 'an `if __name__ == "__main__":` block' if main_guard else f"code at module level (line {code_line})"
        if train is None:
            return "script", f"detected: no train(ctx) at module level, and {what}"
        return "script", f"detected: {what}, and its train() does not take ctx as first parameter"
    if train is None:
        raise ConfigError(
            f"job file {path}: defines no train(ctx) function at module level; "
            "raytrain calls train(ctx) on every worker (to run a deepspeed/torchrun script unchanged, "
            "give --script)",
            flag="JOB",
        )
    if not takes_ctx:
        raise ConfigError(
            f"job file {path}: train() takes no argument; define it as train(ctx)", flag="JOB"
        )
    _check_called_with_ctx(path, train)
    return "train", "train(ctx)"


def _check_called_with_ctx(path: str, train: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """raytrain calls ``train(ctx)`` with exactly one argument: refuse a signature that needs more."""
    args = train.args
    params = [*args.posonlyargs, *args.args]
    required = [p.arg for p in params[: len(params) - len(args.defaults)]]
    required_kw = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    if len(required) <= 1 and not required_kw:
        return
    shown = ", ".join([p.arg for p in params] + (["*"] if required_kw and not args.vararg else []) + required_kw)
    raise ConfigError(
        f"job file {path}: train({shown}) needs {len(required) + len(required_kw)} arguments, but raytrain "
        "calls train(ctx) with one, on every worker; define it as def train(ctx) and build the model and "
        "optimizer inside (engine = ctx.deepspeed(model, optimizer)), or give the other parameters defaults",
        flag="JOB",
    )


def check_job_file(path: str | None, script: bool | None = None, args: list[str] | None = None) -> JobFile:
    """The job file, if it exists, parses and either defines ``train(ctx)`` at module level (train mode) or
    is a script (script mode: run as ``__main__`` like the deepspeed launcher or torchrun would).

    ``script``: True (``--script``) forces script mode, False (``--no-script``) train mode, None detects:
    a file with a module-level ``train`` that takes an argument is a job, unless it also looks like a
    script (an ``if __name__ == "__main__":`` block or code run at module level) and train's first
    parameter is not named ``ctx`` (a DeepSpeedExamples-style ``def train(args, engine)`` + main block);
    a file without such a train that looks like a script is a script; anything else is an error.
    """
    p, tree = _parse(path)
    mode, reason = _mode(path, tree, script)
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
        uses_pipeline=uses_pipeline, declares_tp_spec=declares_tp_spec, mode=mode, mode_reason=reason,
        hf_trainer=mode == "script" and is_trainer_script(resolved, args),
    )
