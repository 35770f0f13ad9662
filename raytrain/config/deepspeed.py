"""The DeepSpeed dict: a ``--ds-config`` read and merged under the flags, and the exact dict the workers get."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from raytrain.config.options import Options, flag_of
from raytrain.config.parallel import load_tp_spec
from raytrain.errors import ConfigError

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
# Config-file options that go into zero_optimization as they are (ZeRO-3 prefetch, ZeRO++).
ZERO_KEYS = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "max_live_parameters": "stage3_max_live_parameters",
    "quantized_weights": "zero_quantized_weights",
    "quantized_gradients": "zero_quantized_gradients",
    "hpz_partition_size": "zero_hpz_partition_size",
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


def _precision_view(ds: dict[str, Any]) -> tuple[str, str] | None:
    fp16 = (ds.get("fp16") or {}).get("enabled")
    bf16 = (ds.get("bf16") or ds.get("bfloat16") or {}).get("enabled")
    if fp16 is True and bf16 is True:
        raise ConfigError("--ds-config enables both fp16 and bf16; enable one", flag="--ds-config")
    if fp16 is True:
        return "fp16", "fp16.enabled"
    if bf16 is True:
        return "bf16", "bf16.enabled"
    if (fp16 is False or bf16 is False) and ("fp16" in ds or "bf16" in ds):
        return "fp32", "fp16/bf16.enabled"
    return None


def ds_view(ds: dict[str, Any]) -> dict[str, Any]:
    """The options a DeepSpeed config implies, keyed like Options fields, with the key they came from."""
    view: dict[str, Any] = {}
    zero = ds.get("zero_optimization") or {}
    if _given(zero.get("stage")):
        view["zero"] = (zero["stage"], "zero_optimization.stage")
    for key, name in (
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
        ("train_batch_size", "train_batch"),
        ("gradient_clipping", "grad_clip"),
    ):
        if _given(ds.get(key)):
            view[name] = (ds[key], key)
    precision = _precision_view(ds)
    if precision:
        view["precision"] = precision
    opt_dev = (zero.get("offload_optimizer") or {}).get("device")
    par_dev = (zero.get("offload_param") or {}).get("device")
    if _given(opt_dev) or _given(par_dev):
        offloaded_opt = opt_dev not in (None, "none", "auto")
        offloaded_par = par_dev not in (None, "none", "auto")
        value = "all" if offloaded_par else ("optimizer" if offloaded_opt else "none")
        view["offload"] = (value, "zero_optimization.offload_optimizer/offload_param.device")
    return view


def ds_origins(opts: Options, ds: dict[str, Any], ds_path: str | None, source: str | None = None,
               flag: str = "--ds-config") -> dict[str, Any]:
    """The options ``opts`` leaves open that the DeepSpeed config fills: name -> batch.Origin (where the
    value came from, for errors that blame the config and its key, not a flag the user never gave)."""
    from raytrain.config.batch import Origin

    where = source or f"--ds-config {ds_path}"
    return {name: Origin(where, key, flag) for name, (_value, key) in ds_view(ds).items()
            if getattr(opts, name) is None}


def merge_under_flags(opts: Options, ds: dict[str, Any], ds_path: str | None, source: str | None = None) -> Options:
    """Fill unset options from the ds-config; a set option that disagrees with it is an error.
    ``source`` names where the config came from (default ``--ds-config PATH``)."""
    values = {}
    for name, (ds_value, ds_key) in ds_view(ds).items():
        mine = getattr(opts, name)
        if mine is None:
            values[name] = ds_value
        elif mine != ds_value:
            raise ConfigError(
                f"{flag_of(name)} {mine} contradicts {source or f'--ds-config {ds_path}'} ({ds_key} = {ds_value}); "
                f"drop one of them or make them agree",
                flag=flag_of(name),
            )
    return opts.merged_over(Options(**values)) if values else opts


def _zero_section(ds: dict[str, Any], out: dict[str, Any], *, zero: int, offload: str, use_gpu: bool) -> dict:
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
    return zero_cfg


def _set_precision(ds: dict[str, Any], out: dict[str, Any], precision: str) -> None:
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


def _add_option_sections(out: dict[str, Any], opts: Options, *, tp: int) -> None:
    """Tensor parallel, activation checkpointing and the ZeRO-3/ZeRO++ config-file keys."""
    if tp > 1:
        tp_cfg = dict(out.get("tensor_parallel") or {})
        tp_cfg["autotp_size"] = tp
        if opts.tp_spec:
            tp_cfg["partition_config"] = load_tp_spec(opts.tp_spec)
        out["tensor_parallel"] = tp_cfg
    if opts.activation_checkpointing:
        out["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": opts.offload == "all",
            "contiguous_memory_optimization": False,
            **(out.get("activation_checkpointing") or {}),
        }
    for key, ds_key in ZERO_KEYS.items():
        value = getattr(opts, key)
        if value is not None:
            out["zero_optimization"][ds_key] = value
    if opts.grad_clip is not None:  # resolution fills the default, except for scripts (their own setting)
        out["gradient_clipping"] = opts.grad_clip


def deepspeed_dict(
    ds: dict[str, Any], opts: Options, *, micro: int, accum: int, total: int, use_gpu: bool, tp: int
) -> dict[str, Any]:
    """The exact DeepSpeed dict: ``ds`` (a --ds-config) with the resolved options written over it."""
    out = copy.deepcopy(DS_BASE)
    out.update(copy.deepcopy(ds))
    out["train_batch_size"] = total
    out["train_micro_batch_size_per_gpu"] = micro
    out["gradient_accumulation_steps"] = accum
    out["zero_optimization"] = _zero_section(ds, out, zero=opts.zero, offload=opts.offload, use_gpu=use_gpu)
    if opts.zero > 0 and "optimizer" not in out:
        # Jobs pass client torch optimizers (SGD, AdamW, ...); ZeRO accepts them only with this switch.
        out.setdefault("zero_allow_untested_optimizer", True)
    if opts.offload != "none" and "optimizer" not in out:
        # raytrain passes a client torch optimizer; DeepSpeed must not insist on DeepSpeedCPUAdam.
        out.setdefault("zero_force_ds_cpu_optimizer", False)
    _set_precision(ds, out, opts.precision)
    # Drop any remaining HF-style "auto" placeholders at the top level: DeepSpeed cannot read them.
    out = {k: v for k, v in out.items() if v != "auto"}
    _add_option_sections(out, opts, tp=tp)
    if tp > 1:
        # DeepSpeed's config check counts every rank as data parallel when AutoTP is set from the config
        # (train_batch_size == micro x accum x world size). Leave train_batch_size out and let DeepSpeed
        # derive it; raytrain's global batch (micro x accum x dp) is in Plan.train_batch.
        out.pop("train_batch_size", None)
    return out
