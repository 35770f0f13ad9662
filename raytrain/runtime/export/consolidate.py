"""A checkpoint's whole model state in one process (for ``raytrain export``, both formats)."""
from __future__ import annotations

import json
from pathlib import Path

from raytrain.checkpoints import hf_content


def consolidated_state(d: Path, tag: str | None) -> dict:
    """The model's whole fp32 state_dict from checkpoint ``d``/``tag``: ZeRO shards gathered (zero_to_fp32,
    frozen parameters included), else the module weights; a Trainer checkpoint without DeepSpeed's engine
    state: the weights the Trainer saved (``model.safetensors``, ...)."""
    import torch

    if not hf_content.has_engine_state(d, tag) and hf_content.weights_file(d) is not None:
        state = weights_state(hf_content.weights_file(d))
    elif any("zero_pp_rank" in p.name for p in (d / tag).glob("*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(d), tag=tag)
    else:
        model_states = torch.load(d / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        state = model_states["module"]
    return {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in state.items()}


def weights_state(path: Path) -> dict:
    """A Hugging Face weights file (or a sharded one's index) -> the state_dict."""
    import torch

    if path.name.endswith(".index.json"):
        state: dict = {}
        for shard in sorted(set(json.loads(path.read_text())["weight_map"].values())):
            state.update(weights_state(path.parent / shard))
        return state
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)
