"""Tensor-parallel partitioning, checked before DeepSpeed touches a weight: the AutoTP partition spec (given,
the job's TP_SPEC, or derived from layer names) and which Linear layers it splits, on any module (the
meta-device model on the control plane, the real one on the workers). Imports torch only inside
``check_tp``; never deepspeed."""
from __future__ import annotations

import re
from typing import Any

# Linear layer names by their role in Megatron-style tensor parallelism (Hugging Face, GPT-2, Llama, ...).
COLUMN_NAMES = (
    "q_proj", "k_proj", "v_proj", "qkv_proj", "query", "key", "value", "qkv", "c_attn", "up_proj", "gate_proj",
    "gate_up_proj", "fc1", "fc_in", "c_fc", "w1", "w3", "wi", "dense_h_to_4h",
)
ROW_NAMES = ("o_proj", "out_proj", "down_proj", "fc2", "fc_out", "c_proj", "w2", "wo", "dense_4h_to_h")


class PartitionError(ValueError):
    """The model cannot be split as asked; the message names the layers and what would work."""


def default_spec() -> dict[str, Any]:
    """An AutoTP partition_config for models whose Linear layers carry the usual role names."""
    return {
        "use_default_specs": False,
        "layer_specs": [
            {"patterns": [rf".*\.({'|'.join(COLUMN_NAMES)})\.weight$"], "partition_type": "column"},
            {"patterns": [rf".*\.({'|'.join(ROW_NAMES)})\.weight$"], "partition_type": "row"},
        ],
    }


def choose_spec(configured: dict[str, Any] | None, job_spec: dict[str, Any] | None) -> dict[str, Any]:
    """The partition spec to use: the config's (--tp-spec), else the job's TP_SPEC, else ``default_spec()``."""
    if configured is not None:
        return configured
    return {"use_default_specs": False, **job_spec} if job_spec else default_spec()


def _linear_layers(model: Any) -> dict[str, Any]:
    import torch.nn as nn

    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def check_tp(model: Any, spec: dict[str, Any], tp: int) -> dict[str, str]:
    """Which Linear layers ``spec`` splits (name -> column|row); refuses what cannot be split by ``tp``."""
    compiled = [
        (re.compile(pattern), s.get("partition_type", "column"))
        for s in spec.get("layer_specs") or []
        for pattern in s.get("patterns") or []
    ]
    linears = _linear_layers(model)
    roles: dict[str, str] = {}
    for name, layer in linears.items():
        param = f"{name}.weight"
        for pattern, kind in compiled:
            if pattern.match(param) or pattern.match("." + param):
                roles[name] = kind
                break
    if not roles:
        listed = ", ".join(sorted(linears)[:8]) or "none"
        raise PartitionError(
            f"--tp {tp}: cannot partition this model: none of its Linear layers ({listed}) matches a column/row "
            "pattern; name them like q_proj/up_proj (column) and o_proj/down_proj (row), or give --tp-spec FILE "
            "or TP_SPEC in the job"
        )
    bad = []
    for name, kind in roles.items():
        layer = linears[name]
        dim = layer.out_features if kind == "column" else layer.in_features
        if dim % tp:
            which = "output" if kind == "column" else "input"
            bad.append(f"{name} ({kind}, {which} size {dim})")
    if bad:
        listed = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise PartitionError(f"--tp {tp} does not divide these layers: {listed}; use a --tp that divides them")
    return roles
