"""Pure resolution: Options (+ a --ds-config) -> a validated Plan with the exact DeepSpeed dict.

No Ray, no torch, no network: everything here is unit-testable in milliseconds. Each rule raises a
ConfigError whose message names the flag, the value and what would work. The steps, in order:

    job file and script mode   config.jobfile, config.script_mode
    --ds-config under flags    config.deepspeed
    devices, stages, names     here
    --tp/--pp, ZeRO-3 keys     config.parallel
    elastic --workers MIN-MAX  config.elastic
    batch arithmetic           config.batch
    the DeepSpeed dict         config.deepspeed
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from raytrain import settings
from raytrain.config.batch import Sources, batch_sizes
from raytrain.config.checks import check_int, check_number
from raytrain.config.deepspeed import deepspeed_dict, ds_origins, ds_view, load_ds_config, merge_under_flags
from raytrain.config.hf_trainer import auto_config, merge_checkpoint_args, merge_trainer_args, script_defaults
from raytrain.config.elastic import check_elastic, max_failures_for, parse_workers
from raytrain.config.data import parse_data_pairs, resolve_data
from raytrain.config.job_check import JobFile, check_job_file
from raytrain.config.options import (
    CPU_ALLOCATOR_VAR,
    CPU_ALLOCATORS,
    DEFAULTS,
    ENV_PREFIX,
    OFFLOADS,
    PLACEMENTS,
    PRECISIONS,
    USER_ENV_SWITCHES,
    ZERO_STAGES,
    Options,
    parse_trackers,
)
from raytrain.config.parallel import check_parallel, check_zero3_keys
from raytrain.config.plan import Plan, Scaling
from raytrain.config.script_mode import script_mode_options
from raytrain import redact
from raytrain.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux IFNAMSIZ - 1
# Defaults filled in before the checks. The batch defaults are applied in batch_sizes, which must see what
# the user left open; the others (tp, pp, timeout, ...) where each is read.
FILLED_FIRST = ("workers", "cpus_per_worker", "zero", "offload", "precision")


def _with_ds_config(opts: Options, job: JobFile) -> tuple[Options, dict, Sources]:
    """Options with the DeepSpeed config (--ds-config, or script mode's) merged under them, that config, and
    which options it filled; a Trainer script's TrainingArguments (its command line) merged under both."""
    source, ds_flag = None, "--ds-config"
    if job.mode == "script":
        opts, source, ds_flag = script_mode_options(opts, job)
    ds = load_ds_config(opts.ds_config, flag=ds_flag)
    sources = Sources(ds_origins(opts, ds, opts.ds_config, source, ds_flag))
    merged = merge_under_flags(opts, ds, opts.ds_config, source)
    if job.hf_trainer:
        views = ds_view(ds)
        labels = {
            name: f"{source or f'--ds-config {opts.ds_config}'} ({views[name][1]} = {views[name][0]})"
            for name in views if getattr(opts, name) is None
        }
        merged = merge_checkpoint_args(merge_trainer_args(merged, labels))
    return merged, ds, sources


def _devices(opts: Options) -> tuple[float, float]:
    """(GPUs, CPUs) per worker, and the ZeRO stage, offload and precision they allow."""
    gpus = check_number("gpus_per_worker", opts.gpus_per_worker, 0, strict=False)
    cpus = check_number("cpus_per_worker", opts.cpus_per_worker, 0, strict=True)
    if opts.zero not in ZERO_STAGES:
        raise ConfigError(f"--zero {opts.zero}: unknown ZeRO stage; use 0, 1, 2 or 3", flag="--zero")
    if opts.offload not in OFFLOADS:
        raise ConfigError(f"--offload {opts.offload}: use one of {', '.join(OFFLOADS)}", flag="--offload")
    if opts.precision not in PRECISIONS:
        raise ConfigError(
            f"--precision {opts.precision}: use one of {', '.join(PRECISIONS)}", flag="--precision"
        )
    if opts.precision == "fp16" and not gpus > 0:
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
    return gpus, cpus


def default_name(job_path: str) -> str:
    """The name a job gets without ``--name``: its file's stem, ``_`` as ``-``, every other character a name
    cannot hold as ``-``, leading ones dropped, at most 63 characters; ``job`` when nothing is left."""
    stem = re.sub(r"[^A-Za-z0-9.-]", "-", Path(job_path).stem.replace("_", "-"))
    return stem.lstrip(".-")[:63].rstrip(".-") or "job"


def _name(opts: Options, job: JobFile) -> str:
    name = opts.name or default_name(job.relative)
    if not NAME_RE.match(name):
        raise ConfigError(
            f"--name {name!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
            flag="--name",
        )
    return name


def _env(opts: Options) -> dict[str, str]:
    env = {}
    for key, value in (opts.env or {}).items():
        if not ENV_KEY_RE.match(str(key)):
            raise ConfigError(f"--env {key}=...: {key!r} is not a valid variable name", flag="--env")
        if str(key).startswith(ENV_PREFIX) and key not in USER_ENV_SWITCHES:
            raise ConfigError(
                f"--env {key}=...: names starting with {ENV_PREFIX} are raytrain's own (it sets them for the job); "
                f"the ones you may set: {', '.join(USER_ENV_SWITCHES)}", flag="--env")
        if key == CPU_ALLOCATOR_VAR and str(value).strip().lower() not in CPU_ALLOCATORS:
            raise ConfigError(
                f"--env {CPU_ALLOCATOR_VAR}={value}: use jemalloc (Ray's, preloaded into CPU workers on the nodes "
                "raytrain starts; the default) or glibc (the C library's malloc)", flag="--env")
        if key in USER_ENV_SWITCHES:  # the job would fail on it at start: say so now, naming --env
            try:
                settings.setting(key).parse(str(value))
            except ConfigError as exc:
                raise ConfigError(f"--env {exc}", flag="--env") from None
        env[str(key)] = str(value)
    return env


def _placement(value: str | None) -> str:
    value = DEFAULTS["placement"] if value is None else value
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


def _grad_clip(opts: Options, job: JobFile) -> Options:
    """--grad-clip checked; its default written for train(ctx) jobs. A script keeps its own choice (HF
    Trainer's max_grad_norm, or DeepSpeed's default) unless a flag, profile or --ds-config gives one."""
    if opts.grad_clip is None:
        return opts if job.mode == "script" else dataclasses.replace(opts, grad_clip=DEFAULTS["grad_clip"])
    return dataclasses.replace(opts, grad_clip=check_number("grad_clip", opts.grad_clip, 0, strict=False))


def _data(opts: Options, job: JobFile) -> tuple[list[dict[str, str]], int]:
    """--data/--data-format checked (local paths must exist), and --prefetch."""
    data = opts.data
    if isinstance(data, str):  # a profile's `data: PATH`
        data = {"train": data}
    datasets = resolve_data(parse_data_pairs(data or {}), opts.data_format)
    if datasets and job.mode == "script":
        raise ConfigError(
            "--data: a script reads its own data; ctx.dataset needs a train(ctx) job", flag="--data"
        )
    return datasets, check_int("prefetch", _or_default(opts, "prefetch"), 0)


def _or_default(opts: Options, name: str):
    value = getattr(opts, name)
    return DEFAULTS[name] if value is None else value


def _hang_options(opts: Options, max_failures: int) -> tuple[float | None, str]:
    """--hang-timeout (None: from the step time) and --on-hang; a restart needs --max-failures."""
    hang_timeout_s = None if opts.hang_timeout is None else check_number("hang_timeout", opts.hang_timeout, 0, strict=False)
    on_hang = opts.on_hang or DEFAULTS["on_hang"]
    if on_hang == "restart" and max_failures == 0:
        raise ConfigError("--on-hang restart: restarts count toward --max-failures, which is 0; add --max-failures N "
                          "(N >= 1)", flag="--on-hang")
    return hang_timeout_s, on_hang


def _trackers(opts: Options, job: JobFile) -> list[str]:
    track = parse_trackers(opts.track)
    if track and job.mode == "script":
        raise ConfigError(f"--track {track[0]}: script mode reports no metrics (no ctx.report); write a "
                          "train(ctx) job to track it", flag="--track")
    if opts.mlflow_uri and "mlflow" not in track:
        raise ConfigError(f"--mlflow-uri {redact.text(opts.mlflow_uri)}: add --track mlflow to log to it",
                          flag="--mlflow-uri")
    if opts.track_args and not track:
        raise ConfigError("--track-args: add --track NAME to log the job's arguments to a tracker", flag="--track-args")
    return track


def _checkpoint_mode(opts: Options, job: JobFile) -> str:
    """--checkpoint-mode: async where raytrain owns the save (train(ctx) jobs), sync for a Hugging Face Trainer
    script, whose Trainer writes its checkpoint files itself before raytrain reports them."""
    if job.hf_trainer:
        if opts.checkpoint_mode == "async":
            raise ConfigError("--checkpoint-mode async: a Hugging Face Trainer script writes its own checkpoint "
                              "files (raytrain only reports them); use --checkpoint-mode sync or leave it out",
                              flag="--checkpoint-mode")
        return "sync"
    if job.mode == "script":  # a plain script saves its own checkpoints (script_mode refuses the flag)
        return "sync"
    return opts.checkpoint_mode or "async"


def resolve(opts: Options, *, cluster_has_gpus: bool = False) -> Plan:
    """Validate ``opts`` and build the Plan. ``cluster_has_gpus`` decides an unset --gpus-per-worker."""
    job = check_job_file(opts.job, script=opts.script, args=list(opts.job_args or []))
    opts, ds, sources = _with_ds_config(opts, job)
    filled = {k: DEFAULTS[k] for k in FILLED_FIRST}
    opts = opts.merged_over(Options(**filled, gpus_per_worker=1.0 if cluster_has_gpus else 0.0))

    min_workers, workers = parse_workers(opts.workers)
    gpus, cpus = _devices(opts)
    use_gpu = gpus > 0
    name, env = _name(opts, job), _env(opts)
    checkpoint_every = check_int("checkpoint_every", opts.checkpoint_every or DEFAULTS["checkpoint_every"], 0)
    keep = None if opts.keep is None else check_int("keep", opts.keep, 1)
    checkpoint_mode = _checkpoint_mode(opts, job)
    max_failures = max_failures_for(opts.max_failures, min_workers, workers)
    timeout_s = check_number("timeout", _or_default(opts, "timeout"), 0, strict=True)
    start_timeout_s = check_number("start_timeout", _or_default(opts, "start_timeout"), 0, strict=False)
    hang_timeout_s, on_hang = _hang_options(opts, max_failures)
    interface = _interface(opts.interface)
    datasets, prefetch = _data(opts, job)
    track = _trackers(opts, job)

    tp = check_int("tp", _or_default(opts, "tp"), 1)
    pp = check_int("pp", _or_default(opts, "pp"), 1)
    check_parallel(opts, job, workers=workers, tp=tp, pp=pp)
    check_zero3_keys(opts, workers=workers, use_gpu=use_gpu)
    check_elastic(min_workers, workers, mode=job.mode, tp=tp, pp=pp)
    dp = workers // (tp * pp)
    micro, accum, total = batch_sizes(opts, dp, min_dp=min_workers // (tp * pp), sources=sources)
    opts = _grad_clip(opts, job)
    deepspeed = deepspeed_dict(ds, opts, micro=micro, accum=accum, total=total, use_gpu=use_gpu, tp=tp)
    trainer_args = {}
    if job.hf_trainer:  # the Trainer fills what it owns from its arguments; raytrain's values go there
        deepspeed, trainer_args = auto_config(deepspeed), script_defaults(opts, micro=micro, accum=accum)
    resources = {"CPU": cpus, **({"GPU": gpus} if use_gpu else {})}
    scaling = Scaling(
        num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources,
        placement_strategy=_placement(opts.placement),
        min_workers=min_workers if min_workers < workers else None,
    )
    return Plan(
        name=name, job_file=str(job.path), job_dir=str(job.directory), job_module=job.relative,
        job_args=list(opts.job_args or []), deepspeed=deepspeed, scaling=scaling,
        parallel={"dp": dp, "tp": tp, "pp": pp}, train_batch=total, micro_batch=micro, grad_accum=accum,
        hf_trainer=job.hf_trainer, script_defaults=trainer_args,
        precision=opts.precision, zero=opts.zero, offload=opts.offload, storage=opts.storage, env=env,
        checkpoint_every=checkpoint_every, keep=keep, checkpoint_mode=checkpoint_mode, max_failures=max_failures, resume=opts.resume,
        activation_checkpointing=bool(opts.activation_checkpointing),
        pp_partition=opts.pp_partition or DEFAULTS["pp_partition"],
        interface=interface, timeout_s=timeout_s, start_timeout_s=start_timeout_s, mode=job.mode, data=datasets,
        hang_timeout_s=hang_timeout_s, on_hang=on_hang, spike_guard=bool(opts.spike_guard),
        rollback_after=check_int("rollback_after", _or_default(opts, "rollback_after"), 0),
        max_rollbacks=check_int("max_rollbacks", _or_default(opts, "max_rollbacks"), 0),
        prefetch=prefetch, track=track, mlflow_uri=opts.mlflow_uri, track_args=bool(opts.track_args),
        data_timeout_s=check_number("data_timeout", _or_default(opts, "data_timeout"), 0, strict=False),
    )
