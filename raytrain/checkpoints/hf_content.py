"""What a checkpoint holds of a Hugging Face model, read by the control plane (no torch): a ``train(ctx)``
run's ``raytrain_hf.json`` (the model's config, class and adapter config), or a Trainer script's whole
``checkpoint-N`` folder (``trainer_state.json``, ``config.json``, the weights the Trainer saved, DeepSpeed's
engine state under the tag, a PEFT run's adapter files, the tokenizer's files). ``raytrain export --format hf``
asks :func:`hf_refusal` before it starts (one line: why not, and what would work)."""
from __future__ import annotations

import json
from pathlib import Path

from raytrain.checkpoints import marker as markers

TRAINER_STATE = "trainer_state.json"
TRAINER_BATCH = "raytrain_trainer.json"  # rank 0: the saving run's micro batch, gradient accumulation, world size
CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# What a tokenizer's (or processor's) save_pretrained writes; an export carries the ones the Trainer saved.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json")


def is_trainer_checkpoint(d: str | Path) -> bool:
    return (Path(d) / TRAINER_STATE).is_file()


def weights_file(d: str | Path) -> Path | None:
    """The model weights the Trainer saved (None under ZeRO-3 without 16-bit gathering: only DeepSpeed's shards)."""
    for name in WEIGHTS:
        if (Path(d) / name).is_file():
            return Path(d) / name
    return None


def has_engine_state(d: str | Path, tag: str | None) -> bool:
    """DeepSpeed's engine state (module weights or ZeRO shards) under ``d/tag``."""
    return bool(tag) and any((Path(d) / tag).glob("*model_states.pt"))


def adapter_config(d: str | Path) -> dict | None:
    path = Path(d) / ADAPTER_CONFIG
    return json.loads(path.read_text()) if path.is_file() else None


def adapter_weights(d: str | Path) -> Path | None:
    for name in ADAPTER_WEIGHTS:
        if (Path(d) / name).is_file():
            return Path(d) / name
    return None


def local_base(adapter: dict) -> Path | None:
    """The adapter's base model as a local folder (``base_model_name_or_path``), if it is one here."""
    base = adapter.get("base_model_name_or_path")
    return Path(base) if base and (Path(base) / CONFIG).is_file() else None


def tag_of(d: str | Path) -> str | None:
    found = markers.read_or_none(d)
    return found.tag if found else None


def hf_refusal(d: str | Path, merge_adapter: bool) -> tuple[str, str] | None:
    """Why checkpoint ``d`` cannot become a Hugging Face folder (message, flag), or None."""
    if is_trainer_checkpoint(d):
        return _trainer_refusal(Path(d), merge_adapter)
    described = Path(d) / markers.HF_FILE
    if not described.is_file():
        return (f"--format hf: the checkpoint {d} holds no Hugging Face model (the job's ctx.deepspeed() got a "
                "model that is not a transformers PreTrainedModel or a PEFT model around one); use --format pt",
                "--format")
    if merge_adapter and not json.loads(described.read_text()).get("adapter"):
        return f"--merge-adapter: the run at {d} trained no PEFT adapter; leave it out", "--merge-adapter"
    return None


def _trainer_refusal(d: Path, merge_adapter: bool) -> tuple[str, str] | None:
    adapter = adapter_config(d)
    if adapter is not None:
        if adapter_weights(d) is None:
            return (f"--format hf: the Trainer checkpoint {d} has {ADAPTER_CONFIG} but no adapter weights "
                    f"({' or '.join(ADAPTER_WEIGHTS)}); use --format pt", "--format")
        if merge_adapter and local_base(adapter) is None:
            base = adapter.get("base_model_name_or_path")
            return (f"--merge-adapter: the adapter's base model ({base!r}, its base_model_name_or_path) is not a "
                    f"model folder on this machine, and a PEFT Trainer checkpoint holds the adapter only; leave "
                    f"--merge-adapter out (the export is the adapter: PeftModel.from_pretrained(base, OUT)), or "
                    f"merge it yourself with merge_and_unload()", "--merge-adapter")
        return None
    if not (d / CONFIG).is_file():
        return (f"--format hf: the Trainer checkpoint {d} has no {CONFIG} (the Trainer's model is not a "
                "transformers PreTrainedModel); use --format pt", "--format")
    if weights_file(d) is None and not has_engine_state(d, tag_of(d)):
        return (f"--format hf: the Trainer checkpoint {d} holds no model weights (none of {', '.join(WEIGHTS)}, "
                "no DeepSpeed engine state); export another checkpoint (`raytrain jobs checkpoints RUN`)", "--format")
    if merge_adapter:
        return f"--merge-adapter: the Trainer run at {d} trained no PEFT adapter; leave it out", "--merge-adapter"
    return None


def saved_trainer_batch(d: str | Path) -> dict[str, int] | None:
    """The saving run's batch arithmetic (``micro``, ``grad_accum``, ``world_size``) of a Trainer checkpoint;
    None for a checkpoint saved before raytrain wrote it, or not by a Trainer run."""
    try:
        saved = json.loads((Path(d) / TRAINER_BATCH).read_text())
        return {key: int(saved[key]) for key in ("micro", "grad_accum", "world_size")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trainer_batch_refusal(saved: dict[str, int] | None, source: str, *, micro: int, grad_accum: int,
                          world_size: int) -> tuple[str, str] | None:
    """A resharded Trainer run must keep the saving run's global batch: the Trainer counts its data position in
    optimizer steps (it skips ``global_step x grad_accum`` batches per rank), so another global batch would
    skip a different number of samples. None when it is kept (or nothing is resharded); else (the flag that
    would fix it, one line naming both batches and that flag's value)."""
    if not saved or saved["world_size"] == world_size:
        return None
    before = saved["micro"] * saved["grad_accum"] * saved["world_size"]
    now = micro * grad_accum * world_size
    if before == now:
        return None
    fits = before % (micro * world_size) == 0
    flag = "--grad-accum" if fits else "--workers"
    way = (f"--grad-accum {before // (micro * world_size)} (the Trainer's --gradient_accumulation_steps)" if fits
           else f"--workers {saved['world_size']}")
    return flag, (
        f"checkpoint {source} was saved with a global batch of {before} ({saved['world_size']} workers x micro "
        f"{saved['micro']} x grad-accum {saved['grad_accum']}); this run's is {now} ({world_size} x {micro} x "
        f"{grad_accum}), and the Trainer counts its data position in steps: keep the global batch with {way}"
    )
