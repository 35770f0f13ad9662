"""A Hugging Face Trainer's checkpoints through raytrain's checkpoint path (worker side).

After the Trainer wrote ``OUTPUT_DIR/checkpoint-N`` (its callback's ``on_save``, on every rank), each rank
reports *its own* files of that folder to Ray Train storage with its raytrain marker, as the ``train(ctx)``
checkpointer does: under DeepSpeed every rank writes its ZeRO shards (``zero_pp_rank_R_...``) and its RNG state
(``rng_state_R.pth``), rank 0 everything else (the model, ``trainer_state.json``, ``latest``, the scheduler).
The ranks may share the folder (one node) or not (one folder per node): ownership by name works for both, and
no file is uploaded twice. The storage checkpoint is then a whole Trainer checkpoint folder plus the markers,
which ``resume_from_checkpoint`` loads as it is; ``jobs checkpoints``, ``--resume`` and ``--keep`` treat it
like any other. Rank 0 adds the saving run's batch arithmetic (``raytrain_trainer.json``).

Resuming on another number of workers (prepare_resume): the ZeRO state is converted to a DeepSpeed universal
checkpoint (raytrain.runtime.checkpoint.files, as for ``train(ctx)`` jobs), the Trainer's DeepSpeed config gets
``"checkpoint": {"load_universal": true}``, and the Trainer is given a folder beside the converted state that
holds the checkpoint's own files (links) plus an RNG file for each rank of the new world (check_batch: the
global batch must stay, the Trainer counts its data position in steps).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from raytrain import events
from raytrain.checkpoints import hf_content
from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker
from raytrain.runtime.checkpoint import files as checkpoint

# A file of one rank: DeepSpeed's per-rank ZeRO state (bf16_ prefix with bf16), the Trainer's per-rank RNG state.
RANK_FILES = (re.compile(r"(?:^|_)zero_pp_rank_(\d+)_"), re.compile(r"^rng_state_(\d+)\.pth$"))
TRAINER_FILE = hf_content.TRAINER_BATCH


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


def stage(
    folder: str | os.PathLike, *, rank: int, world_size: int, step: int, metrics: dict[str, Any],
    batch: dict[str, int] | None = None,
) -> str:
    """A fresh directory holding this rank's files of the Trainer checkpoint ``folder`` (hard links, else copies:
    the Trainer may rotate the folder away meanwhile), on rank 0 ``batch`` (TRAINER_FILE) and, last, this rank's
    marker listing them."""
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
    if rank == 0 and batch:
        (out / TRAINER_FILE).write_text(json.dumps(batch, sort_keys=True))
    markers.write(out, Marker(
        rank=rank, world_size=world_size, step=step, tag=deepspeed_tag(src, step), time=time.time(),
        metrics=metrics, files=markers.files_in(out),
    ))
    return str(out)


def report(
    folder: str | os.PathLike, *, rank: int, world_size: int, step: int, metrics: dict[str, Any],
    batch: dict[str, int] | None = None,
) -> None:
    """Every rank reports its part of checkpoint-N to Ray Train (Ray Train keeps the latest for restarts and
    ``--keep``'s retention); rank 0 then emits the checkpoint event."""
    import ray.train

    from raytrain.runtime.checkpoint.lifecycle import wait_until_registered

    directory = stage(folder, rank=rank, world_size=world_size, step=step, metrics=metrics, batch=batch)
    try:
        ray.train.report({**metrics, "step": step}, checkpoint=ray.train.Checkpoint.from_directory(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    wait_until_registered()
    if rank == 0:
        events.emit(events.CHECKPOINT, step=step)


@dataclasses.dataclass(frozen=True)
class Resume:
    """What a Trainer continues from: ``folder`` (its ``resume_from_checkpoint``: raytrain's restore point, or
    the resharded copy of it), the step, and the saving run's world size and batch (None where unknown)."""

    source: str
    folder: str
    step: int | None = None
    saved_world_size: int | None = None
    batch: dict[str, int] | None = None


def prepare_resume(
    restore_from: str, *, world_size: int, local_rank: int, config: dict[str, Any] | None, log: Any
) -> Resume:
    """Before the script runs (its DeepSpeed config not yet written): the restore point as the Trainer loads it.
    A ZeRO checkpoint of another world size is resharded (``config`` then says ``load_universal``); a
    checkpoint without a raytrain marker is given as it is."""
    saved = markers.read_or_none(restore_from)
    if saved is None:
        return Resume(restore_from, restore_from)
    batch = hf_content.saved_trainer_batch(restore_from)
    universal = None
    if config is not None:
        universal = checkpoint.reshard_if_needed(
            config, restore_from, saved.tag, saved_world_size=saved.world_size, world_size=world_size,
            local_rank=local_rank, log=log,
        )
    folder = restore_from if universal is None else trainer_folder(
        restore_from, universal, saved.tag, saved_world_size=saved.world_size, world_size=world_size,
        local_rank=local_rank,
    )
    return Resume(restore_from, folder, saved.step, saved.world_size, batch)


def rng_files(saved_world_size: int, world_size: int) -> dict[str, str]:
    """{the RNG file each rank of this world reads: the saved file it gets}. The Trainer names it
    ``rng_state_R.pth`` in a world of several, ``rng_state.pth`` in a world of one; a rank the saving run did not
    have gets rank 0's state (the Trainer seeds every rank alike, so that is where a new rank would start)."""
    def saved(rank: int) -> str:
        if saved_world_size == 1:
            return "rng_state.pth"
        return f"rng_state_{rank if rank < saved_world_size else 0}.pth"

    if world_size == 1:
        return {"rng_state.pth": saved(0)}
    return {f"rng_state_{r}.pth": saved(r) for r in range(world_size)}


def trainer_folder(
    source: str, universal: str, tag: str, *, saved_world_size: int, world_size: int, local_rank: int
) -> str:
    """A Trainer checkpoint folder for ``world_size`` ranks beside the universal checkpoint ``universal``: the
    converted DeepSpeed state (``tag``, ``latest_universal``), links to the checkpoint's other files
    (``trainer_state.json``, scheduler, model) and an RNG file per rank (rng_files). Local rank 0 builds it,
    the others wait."""
    out = Path(universal).with_name(f"{Path(universal).name}-trainer-w{world_size}")
    if local_rank == 0:
        src = Path(source).resolve()
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for path in src.iterdir():
            name = path.name
            rng = name == "rng_state.pth" or RANK_FILES[1].match(name)
            if name in (tag, "latest") or name.startswith("raytrain_rank") or rng:
                continue
            (out / name).symlink_to(path)
        (out / tag).symlink_to(Path(universal).resolve() / tag)
        (out / "latest_universal").write_text(tag)
        for mine, theirs in rng_files(saved_world_size, world_size).items():
            if (src / theirs).is_file():
                (out / mine).symlink_to(src / theirs)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return str(out)


def check_batch(resume: Resume, *, micro: int, grad_accum: int, world_size: int) -> None:
    """A resharded Trainer run keeps the saving run's global batch (hf_content.trainer_batch_refusal; the CLI
    asks the same before submitting where it sees the checkpoint)."""
    if resume.saved_world_size in (None, world_size):
        return
    refused = hf_content.trainer_batch_refusal(resume.batch, resume.source, micro=micro, grad_accum=grad_accum,
                                               world_size=world_size)
    if refused:
        raise RuntimeError(f"raytrain: {refused[1]}")
