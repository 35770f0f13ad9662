"""Save and load DeepSpeed checkpoints with the job's data position (worker side)."""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker

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


def save(
    engine: Any, *, rank: int, world_size: int, step: int, user_state: dict, metrics: dict, hf_model: dict | None = None
) -> str:
    """Write this rank's part of a checkpoint into a fresh local directory and return it. ``hf_model``: a
    Hugging Face model's config, class and adapter config, which rank 0 writes beside its shard (for
    ``raytrain export --format hf``); a PEFT model's adapter goes beside it as PEFT's own files.

    The marker goes last and lists every file with its size, so readers can tell a complete checkpoint.
    """
    import torch

    directory = Path(tempfile.mkdtemp(prefix=f"raytrain-ckpt-{rank}-"))
    tag = f"step{step}"
    engine.save_checkpoint(str(directory), tag=tag, client_state={"raytrain_step": step})
    torch.save({"rng": _rng_state(), "user_state": user_state, "step": step}, directory / STATE_FILE.format(rank=rank))
    if hf_model is not None and rank == 0:
        (directory / markers.HF_FILE).write_text(json.dumps(hf_model, indent=1, sort_keys=True))
    if hf_model is not None and hf_model.get("adapter"):  # every rank: under ZeRO-3 a gather
        from raytrain.runtime.hf.model import save_adapter

        save_adapter(engine.module, directory, rank=rank)
    markers.write(directory, Marker(
        rank=rank, world_size=world_size, step=step, tag=tag, time=time.time(), metrics=metrics,
        files=markers.files_in(directory),
    ))
    return str(directory)


def needs_reshard(saved_world_size: int, *, world_size: int, zero: int) -> bool:
    """A ZeRO checkpoint saved by a different number of workers: its optimizer shards must be re-cut
    (DeepSpeed universal checkpoint). Stage 0 keeps whole optimizer state on every rank: no re-cut."""
    return zero >= 1 and saved_world_size != world_size


def universal_root() -> Path:
    """This user's folder for converted checkpoints on this node: ``<tmp>/raytrain-universal-UID``, owner
    and mode checked (a predictable shared-/tmp name holding a done-marker would otherwise be trusted)."""
    from raytrain import paths

    return paths.private_dir(Path(tempfile.gettempdir()) / f"raytrain-universal-{os.getuid()}")


def _conversion_failure(directory: str, output: str, saved_world_size: int | None) -> str:
    """Why ``ds_to_universal`` failed, in words: DeepSpeed's universal checkpoint re-cuts Adam-family state
    only (``exp_avg``/``exp_avg_sq``); an SGD or other optimizer's checkpoint cannot be resharded."""
    lines = output.strip().splitlines()
    if any("KeyError: 'exp_avg" in line for line in lines):
        again = f"--workers {saved_world_size}" if saved_world_size else "the number of workers that saved it"
        return (f"raytrain: checkpoint {directory} cannot be resharded to another number of workers: its "
                f"optimizer state is not Adam's (no exp_avg/exp_avg_sq), and DeepSpeed's universal checkpoint "
                f"re-cuts Adam-family state only. Resume with {again}, or train with Adam/AdamW to be able to "
                f"change the number of workers (ZeRO stage 0 keeps whole state and needs no re-cut)")
    tail = "\n".join(lines[-15:])
    return f"raytrain: converting {directory} to a universal checkpoint failed:\n{tail}"


def to_universal(directory: str, tag: str, *, local_rank: int, saved_world_size: int | None = None) -> str:
    """Convert ``directory``/``tag`` to a DeepSpeed universal checkpoint in this node's temp dir (local
    rank 0 converts, the other ranks wait at a barrier); returns the folder to load ``tag`` from."""
    import hashlib
    import shutil
    import subprocess
    import sys

    import torch.distributed as dist

    key = hashlib.sha1(f"{Path(directory).resolve()}:{tag}".encode()).hexdigest()[:16]
    out = universal_root() / key
    done = out / ".raytrain-done"
    if local_rank == 0 and not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
             "--input_folder", str(Path(directory) / tag), "--output_folder", str(out / tag),
             "--num_extract_workers", str(min(4, os.cpu_count() or 1)), "--num_merge_workers", "1",
             "--inject_missing_state"],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(_conversion_failure(directory, proc.stdout + proc.stderr, saved_world_size))
        (out / "latest_universal").write_text(tag)
        done.write_text(f"{time.monotonic() - started:.1f}")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return str(out)


def reshard_if_needed(
    config: dict[str, Any], directory: str, tag: str, *, saved_world_size: int, world_size: int, local_rank: int,
    log: Any,
) -> str | None:
    """Before the engine is built (``train(ctx)`` jobs and Trainer scripts alike): a ZeRO checkpoint saved by
    another number of workers is converted to a DeepSpeed universal checkpoint and ``config`` told to load it
    (``"checkpoint": {"load_universal": true}``). Returns the converted folder (its ``latest_universal`` names
    ``tag``), or None when the checkpoint loads as it is. A checkpoint that cannot be converted (a non-Adam
    optimizer) raises with why and what would work."""
    zero = int((config.get("zero_optimization") or {}).get("stage", 0))
    if not needs_reshard(saved_world_size, world_size=world_size, zero=zero):
        return None
    log(f"raytrain: checkpoint saved by {saved_world_size} worker(s), this run has {world_size}: resharding "
        "ZeRO state (DeepSpeed universal checkpoint)")
    universal = to_universal(directory, tag, local_rank=local_rank, saved_world_size=saved_world_size)
    config.setdefault("checkpoint", {})["load_universal"] = True
    return universal


def load(engine: Any, directory: str, *, rank: int, world_size: int, universal: str | None = None) -> tuple[int, dict]:
    """Load the DeepSpeed state and this rank's RNG/data state; returns (step, user_state).
    ``universal``: a converted copy to load the DeepSpeed state from (resharded to this world size)."""
    import torch

    d = Path(directory)
    saved = markers.read(directory)
    if saved.world_size != world_size and universal is None and not _whole_state(engine):
        raise RuntimeError(
            f"raytrain: checkpoint {directory} was saved by {saved.world_size} workers; this run has "
            f"{world_size}: resume with --workers {saved.world_size}"
        )
    engine.load_checkpoint(
        universal or str(d), tag=saved.tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    state_path = d / STATE_FILE.format(rank=rank)
    state = torch.load(state_path, weights_only=False) if state_path.exists() else {}
    if state.get("rng"):
        _set_rng_state(state["rng"])
    elif (d / STATE_FILE.format(rank=0)).exists():  # a rank the saving run did not have: rank 0's job state
        state = {"user_state": torch.load(d / STATE_FILE.format(rank=0), weights_only=False).get("user_state")}
    return int(saved.step), dict(state.get("user_state") or {})


def _whole_state(engine: Any) -> bool:
    """ZeRO stage 0: every rank holds the whole optimizer state, so any world size can load it."""
    stage = getattr(engine, "zero_optimization_stage", None)
    return callable(stage) and stage() == 0
