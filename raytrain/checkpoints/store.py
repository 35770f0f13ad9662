"""Checkpoints of runs on storage, read by the control plane: which are complete, a run's listing, its
latest complete one, and the checkpoint a ``--resume`` value names. No torch, no deepspeed."""
from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from raytrain.checkpoints import marker as markers
from raytrain.errors import ConfigError

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


def inspect(directory: str | Path) -> CheckpointInfo:
    """What a checkpoint directory holds and whether it is complete (with the reason if not)."""
    d = Path(directory)
    size = _size(d)
    first = markers.read_or_none(d, 0)
    if first is None:
        return CheckpointInfo(str(d), None, None, size, None, False, "rank 0 marker missing")
    world = first.world_size
    info = CheckpointInfo(str(d), first.step, first.time, size, world, True, "", first.metrics)
    for rank in range(world):
        marker = first if rank == 0 else markers.read_or_none(d, rank)
        if marker is None:
            info.complete, info.reason = False, f"rank {rank} marker missing"
            return info
        name = markers.first_missing_file(d, marker)
        if name is not None:
            info.complete, info.reason = False, f"rank {rank} file {name} missing or truncated"
            return info
    return info


def _size(d: Path) -> int:
    """Bytes under ``d``; what vanishes while it is read counts 0 (another rank may be removing an uncommitted
    checkpoint, see :func:`remove_uncommitted`)."""
    total = 0
    try:
        for f in d.rglob("*"):
            try:
                total += f.stat().st_size if f.is_file() else 0
            except OSError:
                pass
    except OSError:
        pass
    return total


def is_checkpoint_dir(path: Path) -> bool:
    return path.name.startswith(CHECKPOINT_PREFIX) or markers.has_markers(path)


def list_checkpoints(run_dir: str | Path) -> list[CheckpointInfo]:
    """Every checkpoint of a run, oldest first (by step, then name)."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    found = [inspect(p) for p in d.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.path))


def latest_complete(run_dir: str | Path, above_step: int | None = None) -> CheckpointInfo | None:
    """A run's complete checkpoint with the highest step (above ``above_step`` if given), or None. Newest first
    by rank 0's marker alone, the full check (every rank's marker and files) only until one is complete: a long
    run's folder on a network file system is not stat'ed file by file."""
    d = Path(run_dir)
    if not d.is_dir():
        return None
    floor = -1 if above_step is None else above_step
    candidates = []
    for p in d.iterdir():
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX):
            first = markers.read_or_none(p, 0)
            if first is not None and first.step is not None and first.step > floor:
                candidates.append((first.step, str(p)))
    for _, path in sorted(candidates, reverse=True):
        info = inspect(path)
        if info.complete:
            return info
    return None


def remove_uncommitted(run_dir: str | Path) -> list[CheckpointInfo]:
    """Delete every checkpoint folder of a run that is not committed; what was deleted. Only where no save is
    in flight: a job's rank 0 calls it as each attempt starts (``--keep``), when every worker of the attempt
    before is gone and no rank of this one has saved yet."""
    removed = []
    for info in list_checkpoints(run_dir):
        if not info.complete:
            shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info)
    return removed


def resolve_resume(spec: str, storage: str | None, flag: str = "--resume") -> CheckpointInfo:
    """``--resume`` value -> the checkpoint to load: a checkpoint directory, a run directory, or a run name
    under ``storage``. Raises ConfigError naming ``flag`` (the argument that gave ``spec``) and what was
    tried."""
    candidates = [Path(spec).expanduser()]
    if storage and not os.path.isabs(spec):
        candidates.append(Path(storage).expanduser() / spec)
    for path in candidates:
        if not path.is_dir():
            continue
        if is_checkpoint_dir(path):
            info = inspect(path)
            if not info.complete:
                raise ConfigError(f"{flag} {spec}: checkpoint {path} is incomplete ({info.reason})", flag=flag)
            return info
        latest = latest_complete(path)
        if latest is not None:
            return latest
        raise ConfigError(f"{flag} {spec}: run {path} has no complete checkpoint", flag=flag)
    tried = ", ".join(str(p) for p in candidates)
    raise ConfigError(
        f"{flag} {spec}: no such run or checkpoint (looked in {tried}); see `raytrain jobs checkpoints`",
        flag=flag,
    )
