"""Checkpoints on storage: which are complete, the latest one of a run, a listing. No torch, no deepspeed.

Each rank writes its DeepSpeed shard and then ``raytrain_rank{R}.json``: the step, the world size and the
name and size of every file it wrote. A checkpoint is complete when the markers of all ranks are there and
every file they list has its recorded size, so a save interrupted at any point (a missing shard, a
truncated file, a missing marker) is never picked for resume.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from raytrain.errors import ConfigError

MARKER = "raytrain_rank{rank}.json"
CHECKPOINT_PREFIX = "checkpoint_"


@dataclass
class CheckpointInfo:
    path: str
    step: int | None
    time: float | None
    size_bytes: int
    world_size: int | None
    complete: bool
    reason: str = ""
    metrics: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _read_marker(directory: Path, rank: int) -> dict | None:
    path = directory / MARKER.format(rank=rank)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def inspect(directory: str | Path) -> CheckpointInfo:
    """What a checkpoint directory holds and whether it is complete (with the reason if not)."""
    d = Path(directory)
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.is_dir() else 0
    first = _read_marker(d, 0)
    if first is None:
        return CheckpointInfo(str(d), None, None, size, None, False, "rank 0 marker missing")
    world = int(first.get("world_size", 1))
    info = CheckpointInfo(str(d), first.get("step"), first.get("time"), size, world, True, "", first.get("metrics"))
    for rank in range(world):
        marker = first if rank == 0 else _read_marker(d, rank)
        if marker is None:
            info.complete, info.reason = False, f"rank {rank} marker missing"
            return info
        for name, expected in (marker.get("files") or {}).items():
            f = d / name
            if not f.is_file() or f.stat().st_size != expected:
                info.complete, info.reason = False, f"rank {rank} file {name} missing or truncated"
                return info
    return info


def is_checkpoint_dir(path: Path) -> bool:
    return path.name.startswith(CHECKPOINT_PREFIX) or any(path.glob("raytrain_rank*.json"))


def list_checkpoints(run_dir: str | Path) -> list[CheckpointInfo]:
    """Every checkpoint of a run, oldest first (by step, then name)."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    found = [inspect(p) for p in d.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.path))


def latest_complete(run_dir: str | Path) -> CheckpointInfo | None:
    complete = [c for c in list_checkpoints(run_dir) if c.complete]
    return complete[-1] if complete else None


def resolve_resume(spec: str, storage: str | None) -> CheckpointInfo:
    """``--resume`` value -> the checkpoint to load: a checkpoint directory, a run directory, or a run name
    under ``storage``. Raises ConfigError naming what was tried."""
    candidates = [Path(spec).expanduser()]
    if storage and not os.path.isabs(spec):
        candidates.append(Path(storage).expanduser() / spec)
    for path in candidates:
        if not path.is_dir():
            continue
        if is_checkpoint_dir(path):
            info = inspect(path)
            if not info.complete:
                raise ConfigError(f"--resume {spec}: checkpoint {path} is incomplete ({info.reason})", flag="--resume")
            return info
        latest = latest_complete(path)
        if latest is not None:
            return latest
        raise ConfigError(f"--resume {spec}: run {path} has no complete checkpoint", flag="--resume")
    tried = ", ".join(str(p) for p in candidates)
    raise ConfigError(
        f"--resume {spec}: no such run or checkpoint (looked in {tried}); see `raytrain jobs checkpoints`",
        flag="--resume",
    )
