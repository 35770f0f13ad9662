"""Hugging Face Trainer scripts in script mode (pure: no transformers import).

A script whose parser is built from ``TrainingArguments`` (the shape of transformers' ``run_clm.py``) owns its
batch size, gradient accumulation, clipping and precision through its own arguments, and transformers checks
every number in the DeepSpeed config against them ("Please correct the following DeepSpeed config values that
mismatch TrainingArguments values", on every rank, after the cluster started). So for such a script raytrain:

- reads the script's own arguments (SCRIPT_ARGS after ``--``): ``--per_device_train_batch_size``,
  ``--gradient_accumulation_steps``, ``--max_grad_norm``, ``--bf16``/``--fp16``, and merges them under its
  flags like a ``--ds-config``: they fill what the flags leave open, and a flag that contradicts one is refused
  before submitting, naming both (``--grad-accum 4`` with ``--gradient_accumulation_steps 2``);
- gives the script, for each of these it does not set itself, raytrain's resolved value (``Plan.script_defaults``:
  the workers add them to the command line only when the script's parser defines the option);
- writes ``"auto"`` into the DeepSpeed config for every value the Trainer owns (batch sizes, accumulation,
  clipping, precision switches; raytrain never writes optimizer or scheduler sections), which the Trainer
  fills from its arguments: whatever the script does, no mismatch at run time.

With nothing given on either side the Trainer's own defaults stand (micro-batch 8, max_grad_norm 1.0), so a
script moved to raytrain trains as before.

Checkpoints (the workers report every checkpoint the Trainer writes to Ray Train storage:
raytrain.runtime.checkpoint.hf_trainer): ``--checkpoint-every N`` is the Trainer's ``--save_steps N`` (save strategy
"steps"), ``--keep N`` its ``--save_total_limit N``; the script's own values fill what these flags leave open
and a contradiction is refused before submitting, naming both. ``--resume`` (and a restart after a failure)
reaches the Trainer as ``train(resume_from_checkpoint=...)``, so with the script's own
``--resume_from_checkpoint`` it is refused.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from raytrain.config.options import Options, flag_of
from raytrain.config.script_args import mentions, options_end
from raytrain.errors import ConfigError

MARKERS = ("TrainingArguments",)  # also matches Seq2SeqTrainingArguments
HF_MICRO_BATCH = 8  # TrainingArguments.per_device_train_batch_size's default
# raytrain option -> the TrainingArguments option that carries it
ARG_OF = {
    "micro_batch": "--per_device_train_batch_size",
    "grad_accum": "--gradient_accumulation_steps",
    "grad_clip": "--max_grad_norm",
}
PRECISION_ARGS = ("--bf16", "--fp16")
SAVE_ARGS = ("--save_strategy", "--save_steps", "--save_total_limit", "--resume_from_checkpoint")
# What the Trainer owns in the DeepSpeed config; "auto" lets it fill each from TrainingArguments.
AUTO_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping")
TRUE, FALSE = {"true", "yes", "y", "1", "t"}, {"false", "no", "n", "0", "f"}


def is_trainer_script(path: Path, args: list[str] | None = None) -> bool:
    """Whether the script (or a module beside it that it imports, one level) uses ``TrainingArguments``, or its
    arguments are Trainer arguments (``--per_device_train_batch_size`` ...)."""
    if args and any(token.partition("=")[0] in ARG_OF.values() for token in args[:options_end(args)]):
        return True
    return mentions(path, *MARKERS, packages=False)


def _bool(flag: str, value: str | None) -> bool:
    if value is None:
        return True
    low = value.lower()
    if low in TRUE | FALSE:
        return low in TRUE
    raise ConfigError(f"{flag} {value} (a script argument): not a truth value; use true or false", flag=flag)


def _number(flag: str, value: str | None, kind: type) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{flag} {value} (a script argument): expected {'an integer' if kind is int else 'a number'}", flag=flag
        ) from None


def script_values(args: list[str]) -> dict[str, tuple[Any, str]]:
    """The raytrain options the script's Trainer arguments imply: {option: (value, "--arg VALUE")}; the last
    occurrence wins, as in argparse."""
    found: dict[str, tuple[Any, str]] = {}
    precision: dict[str, bool] = {}
    end = options_end(args)
    kinds = {"micro_batch": int, "grad_accum": int, "grad_clip": float}
    i = 0
    while i < end:
        name, eq, value = args[i].partition("=")
        nxt = args[i + 1] if i + 1 < end else None
        for option, flag in ARG_OF.items():
            if name == flag:
                if not eq:
                    value, i = nxt, i + 1
                found[option] = (_number(flag, value, kinds[option]), f"{flag} {value}")
        if name in PRECISION_ARGS:
            if not eq and nxt is not None and nxt.lower() in TRUE | FALSE:
                value, eq, i = nxt, "=", i + 1
            precision[name] = _bool(name, value if eq else None)
        i += 1
    if precision.get("--bf16") and precision.get("--fp16"):
        raise ConfigError("--bf16 and --fp16 (script arguments): enable one of them", flag="--precision")
    for name, on in precision.items():
        if on:
            found["precision"] = (name[2:], name)
    if "precision" not in found and precision:
        found["precision"] = ("fp32", " ".join(f"{n} false" for n in precision))
    return found


def given_args(args: list[str], names: tuple[str, ...]) -> dict[str, str | None]:
    """The values the script's options ``names`` are given (``--name VALUE`` or ``--name=VALUE``; the last
    occurrence wins, as in argparse)."""
    end, found, i = options_end(args), {}, 0
    while i < end:
        name, eq, value = args[i].partition("=")
        if name in names:
            if not eq:
                value, i = (args[i + 1] if i + 1 < end else None), i + 1
            found[name] = value
        i += 1
    return found


def _contradiction(mine: str, given: str, name: str) -> ConfigError:
    return ConfigError(
        f"{mine} contradicts the script's {given} (its TrainingArguments); drop one of them or make them agree",
        flag=flag_of(name),
    )


def merge_checkpoint_args(opts: Options) -> Options:
    """``--checkpoint-every``/``--keep``/``--resume`` against the script's ``--save_strategy``/``--save_steps``/
    ``--save_total_limit``/``--resume_from_checkpoint``: the script's values fill what the flags leave open
    (``--save_steps 50`` is a checkpoint every 50 steps), a contradiction is refused naming both."""
    given = given_args(list(opts.job_args or []), SAVE_ARGS)
    values: dict[str, Any] = {}
    strategy, steps = given.get("--save_strategy"), given.get("--save_steps")
    saves_steps = strategy is None or strategy.lower() == "steps"
    every = opts.checkpoint_every or 0
    if every and not saves_steps:
        raise _contradiction(f"--checkpoint-every {every}", f"--save_strategy {strategy}", "checkpoint_every")
    if steps is not None:
        n = _number("--save_steps", steps, float)  # the Trainer also takes a fraction of the run (< 1)
        if every and n != every:
            raise _contradiction(f"--checkpoint-every {every}", f"--save_steps {steps}", "checkpoint_every")
        if not every and saves_steps and n >= 1 and n.is_integer():
            values["checkpoint_every"] = int(n)
    limit = given.get("--save_total_limit")
    if limit is not None:
        n = _number("--save_total_limit", limit, int)
        if opts.keep is not None and opts.keep != n:
            raise _contradiction(f"--keep {opts.keep}", f"--save_total_limit {limit}", "keep")
        if opts.keep is None:
            values["keep"] = n
    point = given.get("--resume_from_checkpoint")
    if opts.resume and point is not None:
        raise ConfigError(
            f"--resume {opts.resume} and the script's --resume_from_checkpoint {point} both name the point to "
            "continue from (raytrain gives the Trainer the restored checkpoint); give one of them",
            flag="--resume",
        )
    return dataclasses.replace(opts, **values) if values else opts


def merge_trainer_args(opts: Options, labels: dict[str, str] | None = None) -> Options:
    """Options with the script's Trainer arguments merged under them (a contradiction is refused, naming both;
    ``labels`` names where an option's value came from when not from its flag, e.g. a DeepSpeed config), and
    the Trainer's default micro-batch when nothing gives a batch size."""
    values: dict[str, Any] = {}
    for name, (value, given) in script_values(list(opts.job_args or [])).items():
        mine = getattr(opts, name)
        if mine is None:
            values[name] = value
        elif mine != value:
            shown = f"{mine:g}" if isinstance(mine, float) else mine
            mine_label = (labels or {}).get(name) or f"{flag_of(name)} {shown}"
            raise ConfigError(
                f"{mine_label} contradicts the script's {given} (its TrainingArguments); drop one of "
                "them or make them agree",
                flag=flag_of(name),
            )
    opts = dataclasses.replace(opts, **values) if values else opts
    if opts.micro_batch is None and opts.train_batch is None:
        opts = dataclasses.replace(opts, micro_batch=HF_MICRO_BATCH)
    return opts


def script_defaults(opts: Options, *, micro: int, accum: int) -> dict[str, str]:
    """The Trainer arguments raytrain gives the script when it does not give them itself (added on the workers
    only if the script's parser defines each option)."""
    out = {ARG_OF["micro_batch"]: str(micro), ARG_OF["grad_accum"]: str(accum)}
    if opts.grad_clip is not None:
        out[ARG_OF["grad_clip"]] = f"{opts.grad_clip:g}"
    if opts.precision in ("bf16", "fp16"):
        out[f"--{opts.precision}"] = "true"
    if opts.checkpoint_every:
        out.update({"--save_strategy": "steps", "--save_steps": str(opts.checkpoint_every)})
    if opts.keep:
        out["--save_total_limit"] = str(opts.keep)
    return out


def auto_config(ds: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed dict with what the Trainer owns set to "auto" (it fills them from TrainingArguments)."""
    out = dict(ds)
    for key in AUTO_KEYS:
        out[key] = "auto"
    for section in ("bf16", "fp16"):
        if isinstance(out.get(section), dict) and out[section].get("enabled") is True:
            out[section] = {**out[section], "enabled": "auto"}
    return out
