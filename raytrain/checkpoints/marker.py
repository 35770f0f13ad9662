"""The checkpoint marker: the one owner of its file names and fields. No torch, no deepspeed.

Each rank writes its DeepSpeed shard and then, last, ``raytrain_rank{R}.json``: the step, the world size,
the DeepSpeed tag, the time, the step's metrics and the name and size of every file it wrote. A
checkpoint is complete when the markers of all ranks are there and every file they list has its recorded
size, so a save interrupted at any point (a missing shard, a truncated file, a missing marker) shows.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MARKER = "raytrain_rank{rank}.json"
MARKER_GLOB = "raytrain_rank*.json"
# A Hugging Face model's config, class and PEFT adapter config, written by rank 0 beside its shard (listed in
# its marker): what ``raytrain export --format hf`` rebuilds the model from.
HF_FILE = "raytrain_hf.json"


@dataclass(frozen=True)
class Marker:
    rank: int
    world_size: int
    step: int | None
    tag: str | None  # the DeepSpeed tag (sub-folder) the engine state was saved under
    time: float | None  # time.time() of the save
    metrics: dict[str, Any] | None = None  # the metrics of the step saved
    files: dict[str, int] = field(default_factory=dict)  # every file this rank wrote (relative path) -> bytes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Marker":
        return cls(
            rank=int(data.get("rank", 0)),
            world_size=int(data.get("world_size", 1)),
            step=data.get("step"),
            tag=data.get("tag"),
            time=data.get("time"),
            metrics=data.get("metrics"),
            files=dict(data.get("files") or {}),
        )


def marker_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / MARKER.format(rank=rank)


def files_in(directory: str | Path) -> dict[str, int]:
    """Every file under ``directory`` (relative path -> size): what a rank's marker lists."""
    root = Path(directory)
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def write(directory: str | Path, marker: Marker) -> None:
    """Write ``marker`` atomically (a reader sees the whole marker or none)."""
    path = marker_path(directory, marker.rank)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(marker)))
    os.replace(tmp, path)


def read(directory: str | Path, rank: int = 0) -> Marker:
    """Rank ``rank``'s marker; OSError if it is missing, ValueError if it does not parse."""
    data = json.loads(marker_path(directory, rank).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{marker_path(directory, rank)}: not a raytrain checkpoint marker")
    return Marker.from_dict(data)


def read_or_none(directory: str | Path, rank: int = 0) -> Marker | None:
    try:
        return read(directory, rank)
    except (OSError, ValueError):
        return None


def has_markers(directory: str | Path) -> bool:
    return any(Path(directory).glob(MARKER_GLOB))


def first_missing_file(directory: str | Path, marker: Marker) -> str | None:
    """The first file ``marker`` lists that is missing or not its recorded size (None: all there)."""
    root = Path(directory)
    for name, expected in marker.files.items():
        try:
            st = (root / name).stat()
        except OSError:  # missing, or removed while read
            return name
        if not stat.S_ISREG(st.st_mode) or st.st_size != expected:
            return name
    return None
