"""Script mode's resolution rules: what a script (run as ``__main__``) cannot use, and its DeepSpeed config.

A DeepSpeed config the user passes in SCRIPT_ARGS (``--deepspeed_config PATH``) is read like ``--ds-config``:
raytrain's flags are merged into it (a contradiction is an error) and the workers pass the merged copy in
its place (raytrain.config.script_args finds it on the command line).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from raytrain.config.job_check import JobFile
from raytrain.config.options import Options, flag_of
from raytrain.config.script_args import find_config_arg
from raytrain.errors import ConfigError

# raytrain checkpoints through train(ctx)'s engine, or a Hugging Face Trainer's (raytrain.config.hf_trainer)
TRAIN_CTX_ONLY = ("checkpoint_every", "keep", "resume", "checkpoint_mode")


def _refuse_train_ctx_options(opts: Options, *, hf_trainer: bool) -> None:
    for name in () if hf_trainer else TRAIN_CTX_ONLY:
        if getattr(opts, name):
            flag = flag_of(name)
            raise ConfigError(
                f"{flag}: raytrain checkpoints through train(ctx)'s engine or a Hugging Face Trainer's; this "
                f"script (script mode) saves and loads its own checkpoints: drop {flag}",
                flag=flag,
            )
    if opts.pp not in (None, 1):
        raise ConfigError(
            f"--pp {opts.pp}: raytrain's pipeline stages need a train(ctx) job (ctx.pipeline); a script builds "
            "its own deepspeed.pipe.PipelineModule: drop --pp",
            flag="--pp",
        )


def script_mode_options(opts: Options, job: JobFile) -> tuple[Options, str | None, str]:
    """Script mode's checks, and the DeepSpeed config given in the script's arguments as ``ds_config``.
    Returns (options, the config's label for errors or None, the flag that gave it)."""
    _refuse_train_ctx_options(opts, hf_trainer=job.hf_trainer)
    arg = find_config_arg(opts.job_args or [])
    if arg is None:
        return opts, None, "--ds-config"
    candidates = [Path(arg.path).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(job.directory / arg.path)
    found = next((c for c in candidates if c.is_file()), None)
    label = f"{arg.flag} {arg.path} (a script argument)"
    if found is None:
        raise ConfigError(
            f"{label}: no such file (looked in the current directory and in {job.directory})", flag=arg.flag
        )
    if opts.ds_config and Path(opts.ds_config).expanduser().resolve() != found.resolve():
        raise ConfigError(
            f"--ds-config {opts.ds_config} and {label} both give a DeepSpeed config; give one of them",
            flag="--ds-config",
        )
    return dataclasses.replace(opts, ds_config=str(found.resolve())), label, arg.flag
