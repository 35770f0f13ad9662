"""A Hugging Face Trainer's checkpoints through raytrain's checkpoint path (worker side).

After the Trainer wrote ``OUTPUT_DIR/checkpoint-N`` (its callback's ``on_save``, on every rank), each rank
reports *its own* files of that folder to Ray Train storage with its raytrain marker, as the ``train(ctx)``
checkpointer does: under DeepSpeed every rank writes its ZeRO shards (``zero_pp_rank_R_...``) and its RNG state
(``rng_state_R.pth``), rank 0 everything else (the model, ``trainer_state.json``, ``latest``, the scheduler).
The ranks may share the folder (one node) or not (one folder per node): ownership by name works for both, and
no file is uploaded twice. The storage checkpoint is then a whole Trainer checkpoint folder plus the markers,
which ``resume_from_checkpoint`` loads as it is; ``jobs checkpoints``, ``--resume`` and ``--keep`` treat it
like any other.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from raytrain import events
from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker

# A file of one rank: DeepSpeed's per-rank ZeRO state (bf16_ prefix with bf16), the Trainer's per-rank RNG state.
RANK_FILES = (re.compile(r"(?:^|_)zero_pp_rank_(\d+)_"), re.compile(r"^rng_state_(\d+)\.pth$"))


def owner(relative: str) -> int:
    """The rank that writes the checkpoint file at ``relative`` (a path inside checkpoint-N); 0 for shared files."""
    name = relative.rsplit("/", 1)[-1]
    for pattern in RANK_FILES:
        found = pattern.search(name)
        if found:
            return int(found.group(1))
    return 0


def deepspeed_tag(folder: Path, step: int) -> str:
    """The DeepSpeed tag (sub-folder) of the engine state in a Trainer checkpoint: ``latest``'s, or the
    Trainer's naming."""
    try:
        return (folder / "latest").read_text().strip() or f"global_step{step}"
    except OSError:
        return f"global_step{step}"


def stage(folder: str | os.PathLike, *, rank: int, world_size: int, step: int, metrics: dict[str, Any]) -> str:
    """A fresh directory holding this rank's files of the Trainer checkpoint ``folder`` (hard links, else copies:
    the Trainer may rotate the folder away meanwhile) and, last, this rank's marker listing them."""
    src = Path(folder)
    out = Path(tempfile.mkdtemp(prefix=f"raytrain-hf-ckpt-{rank}-"))
    for path in sorted(src.rglob("*")) if src.is_dir() else []:
        relative = path.relative_to(src).as_posix()
        if not path.is_file() or owner(relative) != rank or relative.startswith("raytrain_rank"):
            continue
        dest = out / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
    markers.write(out, Marker(
        rank=rank, world_size=world_size, step=step, tag=deepspeed_tag(src, step), time=time.time(),
        metrics=metrics, files=markers.files_in(out),
    ))
    return str(out)


def report(folder: str | os.PathLike, *, rank: int, world_size: int, step: int, metrics: dict[str, Any]) -> None:
    """Every rank reports its part of checkpoint-N to Ray Train (Ray Train keeps the latest for restarts and
    ``--keep``'s retention); rank 0 then emits the checkpoint event."""
    import ray.train

    from raytrain.runtime.checkpointer import wait_until_registered

    directory = stage(folder, rank=rank, world_size=world_size, step=step, metrics=metrics)
    try:
        ray.train.report({**metrics, "step": step}, checkpoint=ray.train.Checkpoint.from_directory(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    wait_until_registered()
    if rank == 0:
        events.emit(events.CHECKPOINT, step=step)


def check_restore(restore_from: str, *, world_size: int, zero: int) -> int | None:
    """The step of the restore point (None: no raytrain marker). A ZeRO checkpoint saved by another number of
    workers cannot be loaded by the Trainer (its shards are cut per rank): refused with what would work."""
    saved = markers.read_or_none(restore_from)
    if saved is None:
        return None
    if zero >= 1 and saved.world_size != world_size:
        raise RuntimeError(
            f"raytrain: checkpoint {restore_from} was saved by {saved.world_size} workers; this run has "
            f"{world_size}, and a Trainer's ZeRO checkpoint is not resharded: resume with --workers {saved.world_size}"
        )
    return saved.step
