"""Parallelism checks: tensor/pipeline parallel sizes (--tp, --pp), an AutoTP --tp-spec, ZeRO-3/ZeRO++ keys."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from raytrain.config.checks import check_int
from raytrain.config.job_check import JobFile
from raytrain.config.options import PP_PARTITIONS, Options
from raytrain.errors import ConfigError


def load_tp_spec(path: str) -> dict[str, Any]:
    """An AutoTP ``partition_config`` ({"layer_specs": [{"patterns": [...], "partition_type": ...}]})."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"--tp-spec {path}: no such file", flag="--tp-spec")
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(p.read_text())
        else:
            data = json.loads(p.read_text())
    except Exception as exc:
        raise ConfigError(f"--tp-spec {path}: cannot parse: {exc}", flag="--tp-spec") from exc
    specs = data.get("layer_specs") if isinstance(data, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ConfigError(
            f"--tp-spec {path}: expected {{\"layer_specs\": [{{\"patterns\": [REGEX, ...], "
            f"\"partition_type\": \"column\" | \"row\"}}, ...]}}",
            flag="--tp-spec",
        )
    for spec in specs:
        if spec.get("partition_type", "column") not in ("column", "row", "skip"):
            raise ConfigError(
                f"--tp-spec {path}: partition_type {spec.get('partition_type')!r}: use column or row",
                flag="--tp-spec",
            )
        for pattern in spec.get("patterns") or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"--tp-spec {path}: bad pattern {pattern!r}: {exc}", flag="--tp-spec") from exc
    return {"use_default_specs": False, **data}


def check_parallel(opts: Options, job: JobFile, *, workers: int, tp: int, pp: int) -> None:
    """--tp/--pp against the workers, the ZeRO stage and the job file; --pp-partition and --tp-spec."""
    if workers % (tp * pp):
        raise ConfigError(
            f"--workers {workers} is not divisible by --tp {tp} x --pp {pp} = {tp * pp}; use a multiple of "
            f"{tp * pp} workers (data-parallel size = workers / (tp x pp))",
            flag="--workers",
        )
    if tp > 1 and pp > 1:
        raise ConfigError(
            "--tp and --pp together are not supported by DeepSpeed's AutoTP training; use one of them",
            flag="--tp",
        )
    if pp > 1 and opts.zero in (2, 3):
        raise ConfigError(
            f"--zero {opts.zero} with --pp {pp}: DeepSpeed refuses ZeRO-2/3 with pipeline parallelism; "
            "use --zero 1 (or 0) with --pp",
            flag="--zero",
        )
    if pp > 1 and not job.uses_pipeline:
        raise ConfigError(
            f"--pp {pp}: job file {job.relative} gives raytrain no layers; build the model with "
            "ctx.pipeline(layers, loss_fn) (see jobs/gpt_pipe.py)",
            flag="--pp",
        )
    if opts.pp_partition is not None:
        if pp == 1:
            raise ConfigError("--pp-partition needs --pp 2 or more", flag="--pp-partition")
        if opts.pp_partition not in PP_PARTITIONS and not str(opts.pp_partition).startswith("type:"):
            raise ConfigError(
                f"--pp-partition {opts.pp_partition}: use parameters, uniform or type:REGEX", flag="--pp-partition"
            )
    if opts.tp_spec and tp == 1:
        raise ConfigError("--tp-spec needs --tp 2 or more", flag="--tp-spec")


def check_zero3_keys(opts: Options, *, workers: int, use_gpu: bool) -> None:
    """The ZeRO-3 prefetch and ZeRO++ config-file keys: they need ZeRO-3 (and ZeRO++ GPU workers)."""
    chosen = [k for k in ("quantized_weights", "quantized_gradients") if getattr(opts, k) is True]
    if opts.hpz_partition_size not in (None, 1):
        chosen.append("hpz_partition_size")
    if chosen and opts.zero != 3:
        raise ConfigError(
            f"{', '.join(chosen)} (ZeRO++) need --zero 3 (got --zero {opts.zero})", flag="--zero"
        )
    if chosen and not use_gpu:
        raise ConfigError(
            f"{', '.join(chosen)} (ZeRO++) run CUDA kernels: use GPU workers (--gpus-per-worker 1) or drop them",
            flag="--gpus-per-worker",
        )
    if opts.hpz_partition_size is not None:
        hpz = check_int("hpz_partition_size", opts.hpz_partition_size, 1)
        if workers % hpz:
            raise ConfigError(
                f"hpz_partition_size {hpz} must divide --workers {workers} (use the GPUs per node)",
                flag="hpz_partition_size",
            )
    for key in ("prefetch_bucket_size", "max_live_parameters"):
        value = getattr(opts, key)
        if value is not None:
            check_int(key, value, 1)
            if opts.zero != 3:
                raise ConfigError(f"{key} is a ZeRO-3 setting; it needs --zero 3", flag=key)
