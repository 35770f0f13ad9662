"""``raytrain export RUN --format hf --out DIR``: a Hugging Face model folder from a checkpoint of a run whose
``train(ctx)`` gave ``ctx.deepspeed`` a transformers model (or a PEFT model around one), or of a Hugging Face
Trainer script's run (raytrain.runtime.export.hf_trainer).

The checkpoint's ZeRO shards are consolidated as for the ``.pt`` export; the model is rebuilt from the
config, class and adapter config rank 0 saved beside its shard (``raytrain_hf.json``), loaded with that
state and written with ``save_pretrained`` (``config.json`` + safetensors shards of at most
``max_shard_size``), so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it. A LoRA/PEFT run:
``merge_adapter`` folds the adapter into the weights (``merge_and_unload``: a plain model folder);
without it DIR holds the adapter (``adapter_config.json``, ``adapter_model.safetensors``) and the base model
it was trained on in ``DIR/base`` (which the adapter config names, so ``from_pretrained(DIR)`` loads both).
DIR is written whole or not at all (a temporary folder beside it, renamed into place).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from raytrain.checkpoints import hf_content
from raytrain.checkpoints import marker as markers
from raytrain.runtime.export.consolidate import consolidated_state
from raytrain.runtime.hf.rebuild import build_model, load_state, save

BASE_FOLDER = "base"


def read_hf_model(checkpoint_dir: Path) -> dict:
    path = checkpoint_dir / markers.HF_FILE
    if not path.is_file():
        raise SystemExit(f"{checkpoint_dir}: no {markers.HF_FILE}: the run's model is not a Hugging Face model")
    return json.loads(path.read_text())


def write_folder(model: Any, described: dict, tmp: Path, final: Path, *, dtype: str, merge_adapter: bool,
                 max_shard_size: str) -> str:
    """Write the model into ``tmp`` (renamed to ``final`` afterwards); returns what the adapter became."""
    if not described.get("adapter"):
        save(model, tmp, dtype=dtype, max_shard_size=max_shard_size)
        return "none"
    if merge_adapter:
        save(model.merge_and_unload(), tmp, dtype=dtype, max_shard_size=max_shard_size)
        return "merged"
    model.peft_config[model.active_adapter].base_model_name_or_path = str(final / BASE_FOLDER)
    if dtype == "bf16":
        import torch

        model = model.to(torch.bfloat16)
    model.save_pretrained(str(tmp), safe_serialization=True)
    save(model.unload(), tmp / BASE_FOLDER, dtype=dtype, max_shard_size=max_shard_size)
    return "folder"


def replace_folder(tmp: Path, final: Path) -> None:
    """``final`` becomes ``tmp``: the old folder (if any) is moved aside first and removed after."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_hf(checkpoint_dir: str, out: str, *, dtype: str = "fp32", merge_adapter: bool = False,
              max_shard_size: str = "2GB") -> dict:
    d = Path(checkpoint_dir)
    marker = markers.read(d)
    final = Path(out).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        if hf_content.is_trainer_checkpoint(d):
            from raytrain.runtime.export.hf_trainer import write_trainer_folder

            fields = write_trainer_folder(d, tmp, tag=marker.tag, dtype=dtype, merge_adapter=merge_adapter,
                                          max_shard_size=max_shard_size)
        else:
            fields = _write_ctx_folder(d, marker.tag, tmp, final, dtype=dtype, merge_adapter=merge_adapter,
                                       max_shard_size=max_shard_size)
        os.chmod(tmp, 0o777 & ~_umask())
        replace_folder(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.is_file())
    return {"checkpoint": str(d), "step": marker.step, "out": out, "format": "hf", "dtype": dtype, **fields,
            "files": files}


def _write_ctx_folder(d: Path, tag: str | None, tmp: Path, final: Path, *, dtype: str, merge_adapter: bool,
                      max_shard_size: str) -> dict:
    """A train(ctx) run's checkpoint (raytrain_hf.json + DeepSpeed's state) into ``tmp``."""
    described = read_hf_model(d)
    model = build_model(described)
    load_state(model, consolidated_state(d, tag))
    model.eval()
    parameters = int(sum(p.numel() for p in model.parameters()))
    adapter = write_folder(model, described, tmp, final, dtype=dtype, merge_adapter=merge_adapter,
                           max_shard_size=max_shard_size)
    return {"adapter": adapter, "architecture": described["architecture"], "parameters": parameters}


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
