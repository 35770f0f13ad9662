"""The options a user gives, each declared once: its flag, config-file key, help and default come from here.

``Options`` is everything ``raytrain submit`` accepts. Each field is declared with :func:`option`, and
everything else is derived from that declaration:

- the Click option of ``raytrain submit`` (raytrain.cli.options), in field order, with ``{default}`` in the
  help replaced by the declared default;
- the config-file key: the field name (dashes also work), read by raytrain.config.config_file;
- the name errors use for it (:func:`flag_of`): the flag, or the key for config-file-only options;
- the default resolution applies when neither a flag nor a profile gives a value (:data:`DEFAULTS`), which
  is also the config.plan.Plan field's default.

Adding an option (say ``--grad-clip NORM``) is one field here, e.g.
``grad_clip: float | None = option("Clip gradients to this norm.", type=float, metavar="NORM")``, plus the
code that uses its value (resolution: into the DeepSpeed dict or the Plan).

``None`` means "not given", so resolution can tell a flag the user chose from a default (a ``--ds-config``
may set what the user left open, but may not contradict what the user chose).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from raytrain.config.data import FORMATS, parse_data_pairs
from raytrain import settings
from raytrain.errors import ConfigError

ZERO_STAGES = (0, 1, 2, 3)
OFFLOADS = ("none", "optimizer", "all")
PRECISIONS = ("fp32", "bf16", "fp16")
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}
# The job's variable that picks a CPU job's malloc (raytrain.targets.base sets it, raytrain's setup worker
# reads it; that stdlib-only script spells the name itself) and the values it takes
CPU_ALLOCATOR_VAR = "RAYTRAIN_CPU_ALLOCATOR"
CPU_ALLOCATORS = ("jemalloc", "glibc")
# RAYTRAIN_* is raytrain's own prefix: --env may set only these documented switches of the job's runtime; the
# rest (RAYTRAIN_PLAN, RAYTRAIN_RUN_NAME, RAYTRAIN_JOB_CODE (a folder the driver deletes), ...) raytrain sets.
ENV_PREFIX = "RAYTRAIN_"
# The RAYTRAIN_* variables a job may be given with --env (raytrain.settings declares them): every other
# name with the prefix is raytrain's own
USER_ENV_SWITCHES = settings.job_settings()
PP_PARTITIONS = ("parameters", "uniform")  # or "type:REGEX"
TRACKERS = ("tensorboard", "mlflow", "wandb")
CHECKPOINT_MODES = ("async", "sync")


def parse_trackers(names: tuple[str, ...] | list[str] | str | None) -> list[str]:
    """``--track NAME`` (repeatable; a profile may give a list or one name) -> the names, each once."""
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for name in names or ():
        if name not in TRACKERS:
            raise ConfigError(f"--track {name}: not a tracker; use one of {', '.join(TRACKERS)}", flag="--track")
        if name not in out:
            out.append(name)
    return out


def parse_env_pairs(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` (repeatable) -> {KEY: VALUE}."""
    env = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair}: expected KEY=VALUE", flag="--env")
        env[key] = value
    return env


@dataclass(frozen=True)
class OptionSpec:
    """How an Options field is given. Its config-file key is always the field name."""

    help: str = ""  # may contain {default}
    flag: bool = True  # a ``--field-name`` flag; False: a config-file key only (errors name the key)
    generated: bool = True  # False: its Click option is declared by its owner (--address: the target flags)
    type: Any = None  # int, float, bool, "path"; None: text
    choices: tuple | None = None
    metavar: str | None = None
    switch: bool = False  # ``--name/--no-name``, None when neither is given
    multiple: bool = False  # repeatable; ``from_flag`` turns the tuple into the field's value
    from_flag: Callable[[Any], Any] | None = None  # the Click value -> the Options value
    default: Any = None  # what resolution uses when nothing gives a value (None: decided by resolution)


def option(help: str = "", *, default_factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """Declare an Options field (its dataclass default is None, or ``default_factory()``: "not given")."""
    metadata = {"option": OptionSpec(help=help, **spec)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=None, metadata=metadata)


@dataclass
class Options:
    """Everything ``raytrain submit`` accepts, in the order ``raytrain submit --help`` shows it."""

    job: str | None = option("The job file (the JOB argument).", flag=False)
    job_args: list[str] = option("Arguments after `--`: ctx.args, or a script's command line.", flag=False,
                                 default_factory=list)
    address: str | None = option(generated=False, metavar="URL")  # Click option: raytrain.cli.common.address_option
    workers: int | str | None = option(  # N, or "MIN-MAX" for elastic training (Ray Train's worker range)
        "Number of workers (one per GPU), or an elastic range MIN-MAX: start with as many as fit, continue with "
        "fewer (>= MIN) after a lost node, global batch kept. Default {default}.",
        metavar="N|MIN-MAX", default=1,
    )
    gpus_per_worker: float | None = option(  # None: 1 if the cluster has GPUs, else 0
        "GPUs per worker; 0 = CPU workers on gloo. Default: 1 if the cluster has GPUs, else 0.", type=float
    )
    cpus_per_worker: float | None = option("CPUs reserved per worker. Default {default}.", type=float, default=1.0)
    zero: int | None = option("ZeRO stage 0-3. Default {default}.", type=int, default=1)
    offload: str | None = option("ZeRO-Offload to CPU. Default {default}.", choices=OFFLOADS, default="none")
    precision: str | None = option("Default {default}.", choices=PRECISIONS, default="fp32")
    micro_batch: int | None = option("Micro-batch per worker. Default {default}.", type=int, default=1)
    grad_accum: int | None = option("Gradient accumulation steps. Default {default}.", type=int, default=1)
    train_batch: int | None = option("Global batch; must equal micro x accum x data-parallel.", type=int)
    grad_clip: float | None = option(
        "Clip the global gradient norm to NORM; 0 = no clipping. Default {default} (DeepSpeed's and HF "
        "Trainer's); written into the DeepSpeed config (script mode: only when given).",
        type=float, metavar="NORM", default=1.0,
    )
    ds_config: str | None = option("DeepSpeed JSON merged under the flags.", type="path")
    name: str | None = option("Job name (default: the job file's name).")
    storage: str | None = option("Ray Train storage path or URI for this run's results.")
    env: dict[str, str] = option(
        "Environment for the job (repeatable).", metavar="KEY=VALUE", multiple=True, from_flag=parse_env_pairs,
        default_factory=dict,
    )
    data: dict[str, str] = option(  # profile: data: {train: PATH, eval: PATH}
        "A dataset the job reads with ctx.dataset(NAME) (repeatable): a file, folder, glob or URI of JSON Lines, "
        "Parquet, CSV or text files, or a Hugging Face save_to_disk folder; a bare PATH is NAME=train.",
        metavar="NAME=PATH", multiple=True, from_flag=parse_data_pairs, default_factory=dict,
    )
    data_format: str | None = option("The --data format when the extension does not tell.", choices=FORMATS)
    prefetch: int | None = option(
        "Batches ctx.dataset prepares ahead of the training step; 0 = none. Default {default}.", type=int,
        metavar="N", default=2,
    )
    data_timeout: float | None = option(  # seconds without a new block of a --data dataset (0: no limit)
        "Fail the job when reading/preprocessing a --data dataset produces nothing new for SECONDS, naming the "
        "Ray Data tasks still pending (e.g. waiting for CPUs another job holds). 0: wait forever. "
        "Default {default}.", type=float, metavar="SECONDS", default=600.0,
    )
    checkpoint_every: int | None = option(  # steps; 0 = only when the job asks
        "Checkpoint every N steps (and at the end).", type=int, default=0
    )
    keep: int | None = option("Keep only the N latest checkpoints.", type=int)  # None = all
    checkpoint_mode: str | None = option(  # None: async for train(ctx) jobs, sync for HF Trainer scripts
        "async: a save costs the step only a snapshot of the state into host memory; a background thread writes "
        "and uploads it (one save in flight per rank). sync: the step waits for the write and upload. Default: "
        "async for train(ctx) jobs, sync for Hugging Face Trainer scripts (the Trainer writes its own files).",
        choices=CHECKPOINT_MODES,
    )
    max_failures: int | None = option(  # worker-group restarts from the latest checkpoint; -1 = unlimited
        "Restart the workers from the latest checkpoint up to N times (-1: always).", type=int, default=0
    )
    resume: str | None = option(  # a run name, run directory or checkpoint directory
        "Continue a run (job id/run name) or a checkpoint path.", metavar="RUN"
    )
    placement: str | None = option(  # Ray placement group strategy
        "How workers are placed on nodes (Ray placement group). Default {default}.",
        choices=tuple(PLACEMENTS), default="pack",
    )
    interface: str | None = option(  # network interface for gloo/NCCL (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)
        "Network interface for gloo/NCCL on every worker (sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME; checked "
        "before training). Default: the interface that reaches rank 0, when all workers agree.",
        metavar="IFNAME",
    )
    timeout: float | None = option(  # seconds: process-group setup (and each collective) may take this long
        "torch.distributed timeout for process-group setup and each collective. Default {default}.",
        type=float, metavar="SECONDS", default=600.0,
    )
    start_timeout: float | None = option(  # seconds the workers may wait to be placed (0: no limit)
        "Give up (exit 1) when the workers cannot be placed within SECONDS, e.g. because another job holds the "
        "CPUs/GPUs; until then the job is pending and says what it waits for. 0: wait forever. Default {default}.",
        type=float, metavar="SECONDS", default=600.0,
    )
    hang_timeout: float | None = option(  # seconds without a finished step on any rank; None: from the step time
        "Call the job hung when no rank has finished a step for SECONDS: every rank's stack is captured and "
        "summarised (docs/hangs.md). Default: the larger of 10 x the median step and 120 s. 0: no watchdog.",
        type=float, metavar="SECONDS",
    )
    on_hang: str | None = option(
        "What a hang does: report (the summary; the job fails at --timeout with it as the reason), restart "
        "(from the latest checkpoint; counts toward --max-failures) or fail (at once). Default {default}.",
        choices=("report", "restart", "fail"), default="report",
    )
    spike_guard: bool | None = option(  # a loss far above its recent window is a bad step (runtime.worker.guard)
        "Treat a loss spike as a bad step, skipped on every rank: the step's mean loss over all ranks above the "
        "mean + 6 standard deviations of the last 50 good steps, after 20 (docs/guards.md). Default off.",
        switch=True, default=False,
    )
    rollback_after: int | None = option(  # consecutive bad (skipped) steps before a rollback; 0 = never
        "After N bad steps in a row (non-finite, or spikes with --spike-guard), roll back to the last checkpoint "
        "and read on without those steps' rows. 0: never. Default {default}.", type=int, metavar="N", default=3,
    )
    max_rollbacks: int | None = option(  # rollbacks allowed before the job fails with the reason
        "Fail the job instead of rolling back more than N times. Default {default}.", type=int, metavar="N",
        default=3,
    )
    tp: int | None = option("Tensor-parallel size (DeepSpeed AutoTP). Default {default}.", type=int, default=1)
    pp: int | None = option("Pipeline stages (the job calls ctx.pipeline). Default {default}.", type=int, default=1)
    pp_partition: str | None = option(
        "How layers are split over stages: parameters, uniform, type:REGEX.", default="parameters"
    )
    tp_spec: str | None = option("JSON/YAML AutoTP layer_specs for a plain nn.Module.", type="path")
    activation_checkpointing: bool | None = option(
        "Recompute activations in backward (ctx.activation_checkpointed / pipeline layers).", switch=True, default=False
    )
    script: bool | None = option(  # True: run the job file as a script (__main__); None: detect
        "Run JOB.py unchanged as __main__ on every worker, as the deepspeed launcher or torchrun would (script "
        "mode). Default: detected (no train(ctx), a __main__ block or module-level code).",
        switch=True,
    )
    track: list[str] | str = option(  # a profile may give one name
        "Log every report, memory, the config and a summary to a tracker from rank 0 (repeatable): "
        "tensorboard and mlflow write under the run's storage by default; wandb honours its own env.",
        metavar="NAME", choices=TRACKERS, multiple=True, from_flag=parse_trackers, default_factory=list,
    )
    track_args: bool | None = option(
        "Also log the job's arguments (after --; secret-named values masked) as --track params. Default: left out.",
        switch=True, default=False,
    )
    mlflow_uri: str | None = option(
        "MLflow tracking server for --track mlflow (default: an SQLite store under the run's storage).", metavar="URI"
    )
    # ZeRO-3 "cache prefetch" and ZeRO++ "quantisation" strategies: config-file keys only
    prefetch_bucket_size: int | None = option("ZeRO-3 stage3_prefetch_bucket_size.", flag=False, type=int)
    max_live_parameters: int | None = option("ZeRO-3 stage3_max_live_parameters.", flag=False, type=int)
    quantized_weights: bool | None = option("ZeRO++ zero_quantized_weights.", flag=False, type=bool)
    quantized_gradients: bool | None = option("ZeRO++ zero_quantized_gradients.", flag=False, type=bool)
    hpz_partition_size: int | None = option("ZeRO++ zero_hpz_partition_size.", flag=False, type=int)

    def merged_over(self, base: "Options") -> "Options":
        """These options with every unset field taken from ``base``."""
        values = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(base, f.name)
            if f.name in ("env", "data"):
                values[f.name] = {**theirs, **mine}
            elif f.name in ("job_args", "track"):
                values[f.name] = mine or theirs
            else:
                values[f.name] = theirs if mine is None else mine
        return Options(**values)


SPECS: dict[str, OptionSpec] = {f.name: f.metadata["option"] for f in dataclasses.fields(Options)}

# What resolution uses for an option nobody gave (None-valued declarations are decided by resolution).
DEFAULTS: dict[str, Any] = {name: spec.default for name, spec in SPECS.items() if spec.default is not None}


def flag_of(name: str) -> str:
    """The name errors use for option ``name``: its flag (``--micro-batch``), or its config-file key."""
    return "--" + name.replace("_", "-") if SPECS[name].flag else name


def help_of(name: str) -> str:
    """The option's help text with its default filled in."""
    spec = SPECS[name]
    default = spec.default
    shown = f"{default:g}" if isinstance(default, float) else default
    return spec.help.replace("{default}", str(shown))
