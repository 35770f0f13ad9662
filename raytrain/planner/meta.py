"""Count a job's parameters exactly by building its model on torch's meta device (no memory, no download).

The contract for job files: besides ``train(ctx)``, a job may define, at module level,

    def model(args: list[str]) -> torch.nn.Module

``args`` is the job's own argument list (what follows ``--`` on the command line, the same list the job
gets as ``ctx.args``), so ``model`` can parse sizes the way ``train`` does. ``raytrain plan`` calls it inside
``with torch.device("meta"):``, so tensors created without an explicit device have shapes but no storage:
``model`` must only construct the module (no data loading, no ``.item()``, no checkpoint loading). A
``train`` that builds its model with ``model(ctx.args)`` keeps the plan and the run in agreement.

What is read from the module:
  - ``params``: every parameter counted once (shared/tied weights once), exact;
  - ``largest_layer``: the module with most parameters of its own (``parameters(recurse=False)``), the unit
    ZeRO-3 gathers (DeepSpeed's ``model_to_params`` definition), and its name;
  - layers / hidden / heads / vocab, best effort: from a Hugging Face ``config`` when the model has one,
    else the longest ``nn.ModuleList``/``nn.Sequential`` of same-type blocks, the most common
    ``nn.LayerNorm`` width (else the first embedding's width), ``nn.MultiheadAttention.num_heads`` (or a
    ``num_heads``/``n_head`` attribute), and the largest ``nn.Embedding``. Flags override these guesses.

Importing this module does not import torch; the functions do.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
import uuid
import warnings
from collections import Counter
from pathlib import Path

from raytrain.errors import ConfigError
from raytrain.planner.shape import ModelShape

MODEL_FUNCTION = "model"


def _check_defines_model(path: Path, flag: str) -> None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"job file {path}: syntax error at line {exc.lineno}: {exc.msg}", flag=flag) from exc
    if not any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == MODEL_FUNCTION
        for node in tree.body
    ):
        raise ConfigError(
            f"job file {path}: defines no model(args) function; raytrain plan builds the model with it on the "
            "meta device. Add `def model(args): return MyModel(...)` (args: the job's arguments), "
            "or plan with --params/--layers/--hidden instead",
            flag=flag,
        )


def load_model_function(path: str | Path, flag: str = "JOB"):
    """Import the job file (its directory on sys.path meanwhile) and return its ``model`` function."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"job file {path}: no such file", flag=flag)
    if p.suffix != ".py":
        raise ConfigError(f"job file {path}: expected a Python file (.py)", flag=flag)
    _check_defines_model(p, flag)
    directory = str(p.resolve().parent)
    name = f"_raytrain_plan_{p.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, p.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception):
            raise
        raise ConfigError(f"job file {path}: importing it failed: {type(exc).__name__}: {exc}", flag=flag) from exc
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:
            pass
    fn = getattr(module, MODEL_FUNCTION, None)
    if not callable(fn):
        raise ConfigError(f"job file {path}: model is not a function", flag=flag)
    return fn


def build_on_meta(fn, args: list[str], *, where: str = "model(args)"):
    """Call ``fn(args)`` with torch's default device set to meta; the result must be an ``nn.Module``."""
    import torch

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # library deprecation chatter, not the user's business
            module = fn(list(args))
    except SystemExit as exc:  # argparse in model(args) rejecting the job arguments
        raise ConfigError(f"{where} rejected the job arguments {list(args)} (exit {exc.code})", flag="JOB") from exc
    except Exception as exc:
        raise ConfigError(
            f"{where} failed on the meta device: {type(exc).__name__}: {exc}. model(args) must only construct "
            "the module (no data, no .item(), no checkpoint loading)",
            flag="JOB",
        ) from exc
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"{where} returned {type(module).__name__}, expected a torch.nn.Module", flag="JOB")
    return module


def _numel(p) -> int:
    """A parameter's full size, also when ZeRO-3 (``zero.Init``) holds only a partition of it here."""
    return int(getattr(p, "ds_numel", None) or p.numel())


def count_parameters(module) -> int:
    """Every parameter once (``Module.parameters`` skips repeats of a shared tensor)."""
    return sum(_numel(p) for p in module.parameters())


def count_trainable(module) -> int:
    """Parameters that train (``requires_grad``); the others (a PEFT/LoRA run's base model) are frozen."""
    return sum(_numel(p) for p in module.parameters() if p.requires_grad)


def largest_layer(module) -> tuple[int, str]:
    """(parameters, qualified name) of the module with most parameters of its own."""
    best, best_name = 0, ""
    for name, sub in module.named_modules():
        n = sum(_numel(p) for p in sub.parameters(recurse=False))
        if n > best:
            best, best_name = n, name or "(root)"
    return best, best_name


def _guess_dims(module) -> dict:
    from torch import nn

    guess: dict = {}
    cfg = getattr(module, "config", None)
    for key, attrs in (
        ("layers", ("num_hidden_layers", "n_layer", "num_layers")),
        ("hidden", ("hidden_size", "n_embd", "d_model")),
        ("heads", ("num_attention_heads", "n_head", "num_heads")),
        ("vocab", ("vocab_size",)),
    ):
        for attr in attrs:
            value = getattr(cfg, attr, None) if cfg is not None else None
            if isinstance(value, int) and value > 0:
                guess[key] = value
                break
    if "layers" not in guess:
        best = 0
        for sub in module.modules():
            if isinstance(sub, (nn.ModuleList, nn.Sequential)) and len(sub) > 1:
                kinds = {type(child) for child in sub}
                if len(kinds) == 1 and any(True for _ in sub[0].parameters()):
                    best = max(best, len(sub))
        if best:
            guess["layers"] = best
    if "hidden" not in guess:
        widths = Counter(
            sub.normalized_shape[-1] for sub in module.modules()
            if isinstance(sub, nn.LayerNorm) and len(sub.normalized_shape) > 0
        )
        if widths:
            guess["hidden"] = widths.most_common(1)[0][0]
        else:
            emb = next((sub for sub in module.modules() if isinstance(sub, nn.Embedding)), None)
            if emb is not None:
                guess["hidden"] = emb.embedding_dim
    if "heads" not in guess:
        for sub in module.modules():
            if isinstance(sub, nn.MultiheadAttention):
                guess["heads"] = sub.num_heads
                break
            value = getattr(sub, "num_heads", None) or getattr(sub, "n_head", None)
            if isinstance(value, int) and value > 0:
                guess["heads"] = value
                break
    if "vocab" not in guess:
        embeddings = [sub.num_embeddings for sub in module.modules() if isinstance(sub, nn.Embedding)]
        if embeddings:
            guess["vocab"] = max(embeddings)
    return guess


def inspect_module(module, *, source: str = "module") -> ModelShape:
    """A ModelShape from an ``nn.Module`` (meta or real)."""
    params = count_parameters(module)
    if params == 0:
        raise ConfigError(f"{source}: the model has no parameters", flag="JOB")
    layer, layer_name = largest_layer(module)
    guess = _guess_dims(module)
    notes = []
    if guess:
        notes.append(
            "from the model: " + ", ".join(f"{k} {v}" for k, v in guess.items()) + " (flags override)"
        )
    if guess.get("hidden") and guess.get("heads") and guess["hidden"] % guess["heads"]:
        guess.pop("heads")
    trainable = count_trainable(module)
    if trainable < params:
        notes.append(f"trainable: {trainable:,} of {params:,} parameters; the frozen ones get no gradients or "
                     "optimizer state")
    return ModelShape(
        params=params, largest_layer=layer, largest_layer_name=layer_name, layers=guess.get("layers"),
        hidden=guess.get("hidden"), heads=guess.get("heads"), vocab=guess.get("vocab"), source=source,
        notes=tuple(notes), trainable=trainable if trainable < params else None,
    )


def is_hf_config(path: str | Path) -> bool:
    """A Hugging Face model's ``config.json``, or a model folder holding one (what ``raytrain plan`` counts
    with transformers' ``AutoModelForCausalLM.from_config``)."""
    p = Path(path).expanduser()
    return p.suffix == ".json" or (p.is_dir() and (p / "config.json").is_file())


def hf_model_from_config(path: str | Path):
    """``AutoModelForCausalLM.from_config`` of the config at ``path`` (a config.json or a model folder); no
    weights are read, nothing is downloaded. Call it on the meta device."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        raise ConfigError(f"{path}: counting a Hugging Face config needs transformers (pip install "
                          "'raytrain[hf]')", flag="JOB") from exc
    config = AutoConfig.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    return AutoModelForCausalLM.from_config(config)


def inspect_hf_config(path: str | Path) -> ModelShape:
    """The shape of the Hugging Face causal LM a config describes, built on the meta device."""
    p = Path(path).expanduser()
    if not (p.is_file() or p.is_dir()):
        raise ConfigError(f"{path}: no such file or folder", flag="JOB")
    module = build_on_meta(lambda _args: hf_model_from_config(p), [], where=f"{p.name}: from_config")
    return inspect_module(module, source=f"meta:{path}")


def inspect_job(path: str | Path, args: list[str] | tuple[str, ...] = ()) -> ModelShape:
    """Build the job file's ``model(args)`` on the meta device and read its shape."""
    fn = load_model_function(path)
    module = build_on_meta(fn, list(args), where=f"{Path(path).name}: model({list(args)})")
    return inspect_module(module, source=f"meta:{path}")
