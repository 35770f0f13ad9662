"""The options a user gives: flags, a ``--config`` profile (YAML/TOML) and defaults.

``None`` means "not given", so resolution can tell a flag the user chose from a default (a ``--ds-config``
may set what the user left open, but may not contradict what the user chose).
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytrain.errors import ConfigError

ZERO_STAGES = (0, 1, 2, 3)
OFFLOADS = ("none", "optimizer", "all")
PRECISIONS = ("fp32", "bf16", "fp16")
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}


@dataclass
class Options:
    """Everything ``raytrain submit`` accepts. Field names are the config-file keys (dashes also work)."""

    job: str | None = None
    job_args: list[str] = field(default_factory=list)
    script: bool | None = None  # True: run the job file as a script (__main__); None: detect
    address: str | None = None
    workers: int | str | None = None  # N, or "MIN-MAX" for elastic training (Ray Train's worker range)
    gpus_per_worker: float | None = None  # None: 1 if the cluster has GPUs, else 0
    cpus_per_worker: float | None = None
    zero: int | None = None
    offload: str | None = None
    precision: str | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    train_batch: int | None = None
    ds_config: str | None = None
    name: str | None = None
    storage: str | None = None
    checkpoint_every: int | None = None  # steps; 0 = only when the job asks
    keep: int | None = None  # latest checkpoints kept; None = all
    max_failures: int | None = None  # worker-group restarts from the latest checkpoint; -1 = unlimited
    resume: str | None = None  # a run name, run directory or checkpoint directory
    placement: str | None = None  # pack | spread | strict-spread (Ray placement group strategy)
    interface: str | None = None  # network interface for gloo/NCCL (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)
    timeout: float | None = None  # seconds: process-group setup (and each collective) may take this long
    tp: int | None = None  # tensor-parallel size (DeepSpeed AutoTP)
    pp: int | None = None  # pipeline stages (DeepSpeed PipelineModule)
    pp_partition: str | None = None  # "parameters" | "uniform" | "type:REGEX"
    tp_spec: str | None = None  # JSON/YAML file with AutoTP layer_specs for a plain nn.Module
    activation_checkpointing: bool | None = None
    # ZeRO-3 "cache prefetch" and ZeRO++ "quantisation" strategies (config file keys)
    prefetch_bucket_size: int | None = None
    max_live_parameters: int | None = None
    quantized_weights: bool | None = None
    quantized_gradients: bool | None = None
    hpz_partition_size: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    def merged_over(self, base: "Options") -> "Options":
        """These options with every unset field taken from ``base``."""
        values = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(base, f.name)
            if f.name == "env":
                values[f.name] = {**theirs, **mine}
            elif f.name == "job_args":
                values[f.name] = mine or theirs
            else:
                values[f.name] = theirs if mine is None else mine
        return Options(**values)


DEFAULTS = dict(
    workers=1,
    cpus_per_worker=1.0,
    zero=1,
    offload="none",
    precision="fp32",
    micro_batch=1,
    grad_accum=1,
)

_FIELDS = {f.name: f for f in dataclasses.fields(Options)}


def load_profile(path: str | Path) -> Options:
    """Read a ``--config`` profile (.yaml/.yml/.toml/.json) whose keys are Options fields."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file", flag="--config")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # every parser has its own error type
        raise ConfigError(f"--config {path}: cannot parse: {exc}", flag="--config") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option names to values", flag="--config")
    if isinstance(data.get("submit"), dict):  # allow a [submit] table / submit: section
        data = data["submit"]
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in _FIELDS or name == "job_args" and not isinstance(value, list):
            known = ", ".join(sorted(k.replace("_", "-") for k in _FIELDS))
            raise ConfigError(f"--config {path}: unknown key {key!r}; known keys: {known}", flag="--config")
        values[name] = value
    if "env" in values and not isinstance(values["env"], dict):
        raise ConfigError(f"--config {path}: 'env' must be a mapping", flag="--config")
    for key in ("ds_config", "tp_spec"):
        if values.get(key) and not Path(values[key]).is_absolute():
            values[key] = str((p.parent / values[key]).resolve())
    return Options(**values)
