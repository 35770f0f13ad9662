"""``raytrain export RUN --format hf`` of a Hugging Face Trainer script's checkpoint (a whole ``checkpoint-N``
folder in storage, raytrain.runtime.checkpoint.hf_trainer).

- A plain model: rebuilt from the checkpoint's ``config.json`` and loaded with DeepSpeed's fp32 master weights
  (ZeRO shards consolidated as for the ``.pt`` export: under ZeRO-3 the Trainer saves no consolidated weights
  unless ``stage3_gather_16bit_weights_on_model_save``), else with the weights the Trainer saved; written with
  ``save_pretrained`` (``--dtype``, ``--max-shard-size``).
- A PEFT run: the Trainer saved the adapter (``adapter_config.json`` + ``adapter_model.safetensors``; its ZeRO
  state excludes the frozen base). The export is that adapter (``--dtype`` applied), which
  ``PeftModel.from_pretrained(base, OUT)`` loads; ``--merge-adapter`` merges it into its base model when the
  adapter config names a model folder on this machine.

The tokenizer's files the Trainer saved go along."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from raytrain.checkpoints import hf_content
from raytrain.runtime.export.consolidate import consolidated_state
from raytrain.runtime.hf.rebuild import build_model, load_state, save


def describe(d: Path) -> dict:
    """The model as ``hf_rebuild.build_model`` takes it, from the checkpoint's ``config.json``."""
    config = json.loads((d / hf_content.CONFIG).read_text())
    architecture = (config.get("architectures") or ["AutoModelForCausalLM"])[0]
    return {"architecture": architecture, "config": config, "adapter": None}


def model_of(d: Path, tag: str | None) -> tuple[Any, dict]:
    described = describe(d)
    model = build_model(described)
    load_state(model, consolidated_state(d, tag))
    return model, described


def write_model(d: Path, tmp: Path, *, tag: str | None, dtype: str, max_shard_size: str) -> tuple[Any, str]:
    """The plain model into ``tmp``; returns (the model, its architecture)."""
    model, described = model_of(d, tag)
    model.eval()
    save(model, tmp, dtype=dtype, max_shard_size=max_shard_size)
    return model, described["architecture"]


def write_adapter(d: Path, tmp: Path, *, dtype: str) -> int:
    """The Trainer's adapter files into ``tmp`` (weights cast to ``dtype``); returns its parameter count."""
    import torch

    from raytrain.runtime.export.consolidate import weights_state

    state = weights_state(hf_content.adapter_weights(d))
    if dtype == "bf16":
        state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()}
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / hf_content.ADAPTER_WEIGHTS[0]),
              metadata={"format": "pt"})
    shutil.copy2(d / hf_content.ADAPTER_CONFIG, tmp / hf_content.ADAPTER_CONFIG)
    return int(sum(v.numel() for v in state.values()))


def write_merged(d: Path, tmp: Path, *, dtype: str, max_shard_size: str) -> tuple[Any, str]:
    """The adapter merged into its base model (a local folder, hf_content.local_base) into ``tmp``."""
    import peft
    import transformers

    base_dir = hf_content.local_base(hf_content.adapter_config(d))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir))
    merged = peft.PeftModel.from_pretrained(base, str(d)).merge_and_unload().eval()
    save(merged, tmp, dtype=dtype, max_shard_size=max_shard_size)
    return merged, type(merged).__name__


def copy_tokenizer(d: Path, tmp: Path) -> None:
    for name in hf_content.TOKENIZER_FILES:
        if (d / name).is_file():
            shutil.copy2(d / name, tmp / name)


def write_trainer_folder(d: Path, tmp: Path, *, tag: str | None, dtype: str, merge_adapter: bool,
                         max_shard_size: str) -> dict:
    """Checkpoint ``d`` into the folder ``tmp``; returns the result's fields (adapter, architecture,
    parameters)."""
    adapter = hf_content.adapter_config(d)
    if adapter is not None and not merge_adapter:
        parameters = write_adapter(d, tmp, dtype=dtype)
        kind, architecture = "adapter", f"{adapter.get('peft_type', 'PEFT')} adapter"
    else:
        if adapter is not None:
            model, architecture = write_merged(d, tmp, dtype=dtype, max_shard_size=max_shard_size)
        else:
            model, architecture = write_model(d, tmp, tag=tag, dtype=dtype, max_shard_size=max_shard_size)
        parameters = int(sum(p.numel() for p in model.parameters()))
        kind = "merged" if adapter is not None else "none"
    copy_tokenizer(d, tmp)
    return {"adapter": kind, "architecture": architecture, "parameters": parameters}
