"""A Hugging Face model rebuilt from its description (config, class, PEFT adapter config), loaded with a
consolidated state and saved as a Hugging Face folder: what both exports (train(ctx) runs, Trainer runs) share."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def build_model(described: dict) -> Any:
    """The model described (config + class, and the PEFT adapter around it), freshly initialised."""
    import transformers

    config = transformers.AutoConfig.for_model(**described["config"])
    cls = getattr(transformers, described["architecture"], None) or transformers.AutoModelForCausalLM
    model = cls._from_config(config) if hasattr(cls, "_from_config") else cls.from_config(config)
    if described.get("adapter"):
        import peft

        model = peft.get_peft_model(model, peft.get_peft_config(dict(described["adapter"])))
    return model


def load_state(model: Any, state: dict) -> None:
    """Load the consolidated state; every key the model has must be there (tied weights count once)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_keys(model)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(f"the checkpoint does not fit the model its config describes: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")


def _tied_keys(model: Any) -> set[str]:
    """State-dict names that share storage with another name (e.g. a tied lm_head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = id(tensor)
        if key in seen:
            tied.update((name, seen[key]))
        seen[key] = name
    return tied


def save(model: Any, folder: Path, *, dtype: str, max_shard_size: str) -> None:
    import torch

    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(str(folder), max_shard_size=max_shard_size, safe_serialization=True)
