"""Pure resolution: Options (+ a --ds-config) -> a validated Plan with the exact DeepSpeed dict.

No Ray, no torch, no network: everything here is unit-testable in milliseconds. Each rule raises a
ConfigError whose message names the flag, the value and what would work.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from raytrain.config.elastic import batch_problem, parse_workers
from raytrain.config.jobfile import check_job_file
from raytrain.config.options import DEFAULTS, OFFLOADS, PLACEMENTS, PRECISIONS, ZERO_STAGES, Options
from raytrain.config.plan import Plan, Scaling
from raytrain.config.script_args import find_config_arg
from raytrain.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux IFNAMSIZ - 1
DEFAULT_TIMEOUT_S = 600.0  # torch.distributed's timeout for process-group setup and each collective
ELASTIC_MAX_FAILURES = 3  # --workers MIN-MAX without --max-failures: restarts allowed after lost workers

# Defaults raytrain adds to every DeepSpeed config (a --ds-config may override each).
DS_BASE: dict[str, Any] = {
    "steps_per_print": 2**31 - 1,  # raytrain prints progress itself
    "wall_clock_breakdown": False,
}
FP16_DEFAULTS = {
    "enabled": True,
    "loss_scale": 0,  # dynamic loss scaling
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


def load_ds_config(path: str | None, flag: str = "--ds-config") -> dict[str, Any]:
    if not path:
        return {}
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file", flag=flag)
    try:
        data = json.loads(p.read_text())
    except ValueError as exc:
        raise ConfigError(f"{flag} {path}: not valid JSON: {exc}", flag=flag) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a JSON object", flag=flag)
    return data


def _given(value: Any) -> bool:
    """A ds-config value that says something (HF-style "auto" leaves the choice to raytrain)."""
    return value is not None and value != "auto"


def _ds_view(ds: dict[str, Any]) -> dict[str, Any]:
    """The options a DeepSpeed config implies, keyed like Options fields, with the key they came from."""
    view: dict[str, Any] = {}
    zero = ds.get("zero_optimization") or {}
    if _given(zero.get("stage")):
        view["zero"] = (zero["stage"], "zero_optimization.stage")
    for key, name in (
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
        ("train_batch_size", "train_batch"),
    ):
        if _given(ds.get(key)):
            view[name] = (ds[key], key)
    fp16 = (ds.get("fp16") or {}).get("enabled")
    bf16 = (ds.get("bf16") or ds.get("bfloat16") or {}).get("enabled")
    if fp16 is True and bf16 is True:
        raise ConfigError("--ds-config enables both fp16 and bf16; enable one", flag="--ds-config")
    if fp16 is True:
        view["precision"] = ("fp16", "fp16.enabled")
    elif bf16 is True:
        view["precision"] = ("bf16", "bf16.enabled")
    elif fp16 is False or bf16 is False:
        if fp16 is not True and bf16 is not True and ("fp16" in ds or "bf16" in ds):
            view["precision"] = ("fp32", "fp16/bf16.enabled")
    opt_dev = (zero.get("offload_optimizer") or {}).get("device")
    par_dev = (zero.get("offload_param") or {}).get("device")
    if _given(opt_dev) or _given(par_dev):
        offloaded_opt = opt_dev not in (None, "none", "auto")
        offloaded_par = par_dev not in (None, "none", "auto")
        value = "all" if offloaded_par else ("optimizer" if offloaded_opt else "none")
        view["offload"] = (value, "zero_optimization.offload_optimizer/offload_param.device")
    return view


FLAG_OF = {
    "tp": "--tp",
    "pp": "--pp",
    "prefetch_bucket_size": "prefetch_bucket_size",
    "max_live_parameters": "max_live_parameters",
    "hpz_partition_size": "hpz_partition_size",
    "checkpoint_every": "--checkpoint-every",
    "max_failures": "--max-failures",
    "keep": "--keep",
    "zero": "--zero",
    "micro_batch": "--micro-batch",
    "grad_accum": "--grad-accum",
    "train_batch": "--train-batch",
    "precision": "--precision",
    "offload": "--offload",
}


def _merge_ds_under_flags(
    opts: Options, ds: dict[str, Any], ds_path: str | None, source: str | None = None
) -> Options:
    """Fill unset options from the ds-config; a set option that disagrees with it is an error.
    ``source`` names where the config came from (default ``--ds-config PATH``)."""
    values = {}
    for name, (ds_value, ds_key) in _ds_view(ds).items():
        mine = getattr(opts, name)
        if mine is None:
            values[name] = ds_value
        elif mine != ds_value:
            raise ConfigError(
                f"{FLAG_OF[name]} {mine} contradicts {source or f'--ds-config {ds_path}'} ({ds_key} = {ds_value}); "
                f"drop one of them or make them agree",
                flag=FLAG_OF[name],
            )
    return opts.merged_over(Options(**values)) if values else opts


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        flag = FLAG_OF.get(name, "--" + name.replace("_", "-"))
        raise ConfigError(f"{flag} {value!r}: must be an integer >= {minimum}", flag=flag)
    return value


def _check_number(flag: str, value: Any, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        value <= minimum if strict else value < minimum
    ):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"{flag} {value!r}: must be a number {bound}", flag=flag)
    return float(value)


def _batch_sizes(opts: Options, dp: int) -> tuple[int, int, int]:
    """(micro, accum, train_batch) with train_batch = micro x accum x dp; derive what is missing."""
    micro, accum, total = opts.micro_batch, opts.grad_accum, opts.train_batch
    if micro is not None:
        _check_int("micro_batch", micro, 1)
    if accum is not None:
        _check_int("grad_accum", accum, 1)
    if total is None:
        micro = micro or DEFAULTS["micro_batch"]
        accum = accum or DEFAULTS["grad_accum"]
        return micro, accum, micro * accum * dp
    _check_int("train_batch", total, 1)
    if micro is None and accum is None:
        micro = DEFAULTS["micro_batch"]
    if accum is None:
        if total % (micro * dp):
            raise ConfigError(
                f"--train-batch {total} is not divisible by micro-batch {micro} x data-parallel size {dp} "
                f"= {micro * dp}; use a multiple of {micro * dp} (e.g. {max(1, total // (micro * dp)) * micro * dp})",
                flag="--train-batch",
            )
        accum = total // (micro * dp)
    elif micro is None:
        if total % (accum * dp):
            raise ConfigError(
                f"--train-batch {total} is not divisible by grad-accum {accum} x data-parallel size {dp} "
                f"= {accum * dp}; use a multiple of {accum * dp}",
                flag="--train-batch",
            )
        micro = total // (accum * dp)
    elif micro * accum * dp != total:
        raise ConfigError(
            f"--train-batch {total} != micro-batch {micro} x grad-accum {accum} x data-parallel size {dp} "
            f"= {micro * accum * dp}; drop --train-batch or make them agree",
            flag="--train-batch",
        )
    return micro, accum, total


def _deepspeed_dict(
    ds: dict[str, Any], *, zero: int, offload: str, precision: str, micro: int, accum: int, total: int, use_gpu: bool
) -> dict[str, Any]:
    out = copy.deepcopy(DS_BASE)
    out.update(copy.deepcopy(ds))
    out["train_batch_size"] = total
    out["train_micro_batch_size_per_gpu"] = micro
    out["gradient_accumulation_steps"] = accum
    zero_cfg = dict(out.get("zero_optimization") or {})
    zero_cfg["stage"] = zero
    if offload == "none":
        zero_cfg.pop("offload_optimizer", None)
        zero_cfg.pop("offload_param", None)
    if offload in ("optimizer", "all"):
        zero_cfg["offload_optimizer"] = {
            **(ds.get("zero_optimization", {}).get("offload_optimizer") or {}),
            "device": "cpu",
            "pin_memory": use_gpu,
        }
    if offload == "all":
        zero_cfg["offload_param"] = {
            **(ds.get("zero_optimization", {}).get("offload_param") or {}),
            "device": "cpu",
            "pin_memory": use_gpu,
        }
    out["zero_optimization"] = zero_cfg
    if zero > 0 and "optimizer" not in out:
        # Jobs pass client torch optimizers (SGD, AdamW, ...); ZeRO accepts them only with this switch.
        out.setdefault("zero_allow_untested_optimizer", True)
    if offload != "none" and "optimizer" not in out:
        # raytrain passes a client torch optimizer; DeepSpeed must not insist on DeepSpeedCPUAdam.
        out.setdefault("zero_force_ds_cpu_optimizer", False)
    out.pop("bfloat16", None)
    if precision == "fp16":
        out["fp16"] = {**FP16_DEFAULTS, **{k: v for k, v in (ds.get("fp16") or {}).items() if _given(v)}}
        out["fp16"]["enabled"] = True
        out.pop("bf16", None)
    elif precision == "bf16":
        out["bf16"] = {**{k: v for k, v in (ds.get("bf16") or ds.get("bfloat16") or {}).items() if _given(v)}}
        out["bf16"]["enabled"] = True
        out.pop("fp16", None)
    else:
        out.pop("fp16", None)
        out.pop("bf16", None)
    # Drop any remaining HF-style "auto" placeholders at the top level: DeepSpeed cannot read them.
    return {k: v for k, v in out.items() if v != "auto"}


PP_PARTITIONS = ("parameters", "uniform")


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


def _check_parallel(opts: Options, job: Any, *, workers: int, tp: int, pp: int, use_gpu: bool) -> None:
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
        hpz = _check_int("hpz_partition_size", opts.hpz_partition_size, 1)
        if workers % hpz:
            raise ConfigError(
                f"hpz_partition_size {hpz} must divide --workers {workers} (use the GPUs per node)",
                flag="hpz_partition_size",
            )
    for key in ("prefetch_bucket_size", "max_live_parameters"):
        value = getattr(opts, key)
        if value is not None:
            _check_int(key, value, 1)
            if opts.zero != 3:
                raise ConfigError(f"{key} is a ZeRO-3 setting; it needs --zero 3", flag=key)


def _parallel_config(ds: dict[str, Any], opts: Options, *, tp: int, pp: int) -> None:
    """Add tensor parallel, activation checkpointing and ZeRO-3/ZeRO++ knobs to the DeepSpeed dict."""
    if tp > 1:
        tp_cfg = dict(ds.get("tensor_parallel") or {})
        tp_cfg["autotp_size"] = tp
        if opts.tp_spec:
            tp_cfg["partition_config"] = load_tp_spec(opts.tp_spec)
        ds["tensor_parallel"] = tp_cfg
    if opts.activation_checkpointing:
        ds["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": opts.offload == "all",
            "contiguous_memory_optimization": False,
            **(ds.get("activation_checkpointing") or {}),
        }
    zero = ds["zero_optimization"]
    for key, ds_key in (
        ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
        ("max_live_parameters", "stage3_max_live_parameters"),
        ("quantized_weights", "zero_quantized_weights"),
        ("quantized_gradients", "zero_quantized_gradients"),
        ("hpz_partition_size", "zero_hpz_partition_size"),
    ):
        value = getattr(opts, key)
        if value is not None:
            zero[ds_key] = value


def _script_mode(opts: Options, job: Any) -> tuple[Options, str | None, str]:
    """Script mode's checks. A DeepSpeed config the user passes in SCRIPT_ARGS (``--deepspeed_config
    PATH``) is read here like ``--ds-config``: raytrain's flags are merged into it (a contradiction is an
    error) and the workers pass the merged copy in its place. Returns (options, source label, ds flag)."""
    for name, flag in (("checkpoint_every", "--checkpoint-every"), ("keep", "--keep"), ("resume", "--resume")):
        if getattr(opts, name):
            raise ConfigError(
                f"{flag}: raytrain checkpoints through train(ctx)'s engine; a script (script mode) saves and "
                f"loads its own checkpoints: drop {flag}",
                flag=flag,
            )
    if opts.pp not in (None, 1):
        raise ConfigError(
            f"--pp {opts.pp}: raytrain's pipeline stages need a train(ctx) job (ctx.pipeline); a script builds "
            "its own deepspeed.pipe.PipelineModule: drop --pp",
            flag="--pp",
        )
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


def _placement(value: str | None) -> str:
    if value is None:
        return "PACK"
    if value not in PLACEMENTS:
        raise ConfigError(f"--placement {value}: use one of {', '.join(PLACEMENTS)}", flag="--placement")
    return PLACEMENTS[value]


def _interface(value: str | None) -> str | None:
    if value is None:
        return None
    if not IFNAME_RE.match(str(value)):
        raise ConfigError(
            f"--interface {value!r}: not a network interface name (e.g. eth0, ens5, ib0; see `ip -br addr`)",
            flag="--interface",
        )
    return str(value)


def resolve(opts: Options, *, cluster_has_gpus: bool = False) -> Plan:
    """Validate ``opts`` and build the Plan. ``cluster_has_gpus`` decides an unset --gpus-per-worker."""
    job = check_job_file(opts.job, script=opts.script)
    source, ds_flag = None, "--ds-config"
    if job.mode == "script":
        opts, source, ds_flag = _script_mode(opts, job)
    ds = load_ds_config(opts.ds_config, flag=ds_flag)
    opts = _merge_ds_under_flags(opts, ds, opts.ds_config, source)
    # Batch defaults are applied in _batch_sizes, which must see what the user left open to derive it.
    defaults = {k: v for k, v in DEFAULTS.items() if k not in ("micro_batch", "grad_accum")}
    opts = opts.merged_over(Options(**defaults, gpus_per_worker=1.0 if cluster_has_gpus else 0.0))

    min_workers, workers = parse_workers(opts.workers)
    elastic = min_workers < workers
    gpus = _check_number("--gpus-per-worker", opts.gpus_per_worker, 0, strict=False)
    cpus = _check_number("--cpus-per-worker", opts.cpus_per_worker, 0, strict=True)
    if opts.zero not in ZERO_STAGES:
        raise ConfigError(f"--zero {opts.zero}: unknown ZeRO stage; use 0, 1, 2 or 3", flag="--zero")
    if opts.offload not in OFFLOADS:
        raise ConfigError(f"--offload {opts.offload}: use one of {', '.join(OFFLOADS)}", flag="--offload")
    if opts.precision not in PRECISIONS:
        raise ConfigError(
            f"--precision {opts.precision}: use one of {', '.join(PRECISIONS)}", flag="--precision"
        )
    use_gpu = gpus > 0
    if opts.precision == "fp16" and not use_gpu:
        raise ConfigError(
            "--precision fp16 needs GPU workers (DeepSpeed refuses fp16 on CPU); "
            "use --precision bf16 (or fp32) on CPU workers, or give --gpus-per-worker 1",
            flag="--precision",
        )
    if opts.offload != "none" and opts.zero == 0:
        raise ConfigError(
            f"--offload {opts.offload} needs ZeRO: offloading moves ZeRO-partitioned state to CPU; "
            f"add --zero {3 if opts.offload == 'all' else 2}",
            flag="--offload",
        )
    if opts.offload == "all" and opts.zero != 3:
        raise ConfigError(
            f"--offload all also offloads parameters, which needs --zero 3 (got --zero {opts.zero}); "
            "use --zero 3, or --offload optimizer with stage 1 or 2",
            flag="--offload",
        )
    if gpus and gpus != int(gpus) and gpus > 1:
        raise ConfigError(
            f"--gpus-per-worker {gpus:g}: fractions are only possible below 1 GPU; use a whole number",
            flag="--gpus-per-worker",
        )
    name = opts.name or Path(job.relative).stem.replace("_", "-")
    if not NAME_RE.match(name):
        raise ConfigError(
            f"--name {name!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
            flag="--name",
        )
    env = {}
    for key, value in (opts.env or {}).items():
        if not ENV_KEY_RE.match(str(key)):
            raise ConfigError(f"--env {key}={value}: {key!r} is not a valid variable name", flag="--env")
        env[str(key)] = str(value)

    checkpoint_every = _check_int("checkpoint_every", opts.checkpoint_every or 0, 0)
    keep = None if opts.keep is None else _check_int("keep", opts.keep, 1)
    if elastic and opts.max_failures is None:
        max_failures = ELASTIC_MAX_FAILURES  # elastic means "continue after a lost worker"
    else:
        max_failures = _check_int("max_failures", opts.max_failures or 0, -1)
    if elastic and max_failures == 0:
        raise ConfigError(
            f"--workers {min_workers}-{workers} with --max-failures 0: an elastic job continues after a lost "
            "worker by restarting the group; allow restarts (--max-failures N, or leave it unset)",
            flag="--max-failures",
        )
    timeout_s = _check_number("--timeout", DEFAULT_TIMEOUT_S if opts.timeout is None else opts.timeout, 0, strict=True)
    interface = _interface(opts.interface)

    tp = _check_int("tp", 1 if opts.tp is None else opts.tp, 1)
    pp = _check_int("pp", 1 if opts.pp is None else opts.pp, 1)
    _check_parallel(opts, job, workers=workers, tp=tp, pp=pp, use_gpu=use_gpu)
    if elastic and job.mode == "script":
        raise ConfigError(
            f"--workers {min_workers}-{workers}: elastic training needs a train(ctx) job (raytrain restores and "
            "reshards its checkpoints when the worker count changes); this file runs in script mode",
            flag="--workers",
        )
    if elastic and tp * pp > 1:
        raise ConfigError(
            f"--workers {min_workers}-{workers}: elastic training works with data parallelism only (Ray Train "
            f"may pick any size in the range); with --tp {tp} --pp {pp} give a fixed --workers",
            flag="--workers",
        )
    dp = workers // (tp * pp)
    micro, accum, total = _batch_sizes(opts, dp)
    if elastic:
        problem = batch_problem(total, micro, min_workers, workers)
        if problem:
            raise ConfigError(problem, flag="--workers")
    deepspeed = _deepspeed_dict(
        ds,
        zero=opts.zero,
        offload=opts.offload,
        precision=opts.precision,
        micro=micro,
        accum=accum,
        total=total,
        use_gpu=use_gpu,
    )
    _parallel_config(deepspeed, opts, tp=tp, pp=pp)
    if tp > 1:
        # DeepSpeed's config check counts every rank as data parallel when AutoTP is set from the config
        # (train_batch_size == micro x accum x world size). Leave train_batch_size out and let DeepSpeed
        # derive it; raytrain's global batch (micro x accum x dp) is in Plan.train_batch.
        deepspeed.pop("train_batch_size", None)
    resources = {"CPU": cpus}
    if use_gpu:
        resources["GPU"] = gpus
    return Plan(
        name=name,
        job_file=str(job.path),
        job_dir=str(job.directory),
        job_module=job.relative,
        job_args=list(opts.job_args or []),
        deepspeed=deepspeed,
        scaling=Scaling(
            num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources,
            placement_strategy=_placement(opts.placement),
            min_workers=min_workers if elastic else None,
        ),
        parallel={"dp": dp, "tp": tp, "pp": pp},
        train_batch=total,
        precision=opts.precision,
        zero=opts.zero,
        offload=opts.offload,
        storage=opts.storage,
        env=env,
        checkpoint_every=checkpoint_every,
        keep=keep,
        max_failures=max_failures,
        resume=opts.resume,
        activation_checkpointing=bool(opts.activation_checkpointing),
        pp_partition=opts.pp_partition or "parameters",
        interface=interface,
        timeout_s=timeout_s,
        mode=job.mode,
    )
