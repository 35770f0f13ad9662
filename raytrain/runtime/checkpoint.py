"""Save and load DeepSpeed checkpoints with the job's data position (worker side)."""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from raytrain.checkpoints import MARKER

STATE_FILE = "raytrain_state_rank{rank}.pt"


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(engine: Any, *, rank: int, world_size: int, step: int, user_state: dict, metrics: dict) -> str:
    """Write this rank's part of a checkpoint into a fresh local directory and return it.

    The marker goes last and lists every file with its size, so readers can tell a complete checkpoint.
    """
    import torch

    directory = Path(tempfile.mkdtemp(prefix=f"raytrain-ckpt-{rank}-"))
    tag = f"step{step}"
    engine.save_checkpoint(str(directory), tag=tag, client_state={"raytrain_step": step})
    torch.save({"rng": _rng_state(), "user_state": user_state, "step": step}, directory / STATE_FILE.format(rank=rank))
    files = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file()
    }
    marker = {
        "rank": rank,
        "world_size": world_size,
        "step": step,
        "tag": tag,
        "time": time.time(),
        "metrics": metrics,
        "files": files,
    }
    tmp = directory / (MARKER.format(rank=rank) + ".tmp")
    tmp.write_text(json.dumps(marker))
    os.replace(tmp, directory / MARKER.format(rank=rank))
    return str(directory)


def load(engine: Any, directory: str, *, rank: int, world_size: int) -> tuple[int, dict]:
    """Load the DeepSpeed state and this rank's RNG/data state; returns (step, user_state)."""
    import torch

    d = Path(directory)
    marker = json.loads((d / MARKER.format(rank=0)).read_text())
    if marker["world_size"] != world_size:
        raise RuntimeError(
            f"raytrain: checkpoint {directory} was saved by {marker['world_size']} workers; this run has "
            f"{world_size}: resume with --workers {marker['world_size']}"
        )
    engine.load_checkpoint(str(d), tag=marker["tag"], load_optimizer_states=True, load_lr_scheduler_states=True)
    state_path = d / STATE_FILE.format(rank=rank)
    state = torch.load(state_path, weights_only=False) if state_path.exists() else {}
    if state.get("rng"):
        _set_rng_state(state["rng"])
    return int(marker["step"]), dict(state.get("user_state") or {})
