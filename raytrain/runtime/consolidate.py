"""A checkpoint's whole model state in one process (for ``raytrain export``, both formats)."""
from __future__ import annotations

from pathlib import Path


def consolidated_state(d: Path, tag: str) -> dict:
    """The model's whole fp32 state_dict from checkpoint ``d``/``tag``: ZeRO shards gathered (zero_to_fp32,
    frozen parameters included), else the module weights."""
    import torch

    zero_shards = list((d / tag).glob("*optim_states.pt"))
    if zero_shards and any("zero_pp_rank" in p.name for p in zero_shards):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(d), tag=tag)
    else:
        model_states = torch.load(d / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        state = model_states["module"]
    return {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in state.items()}
