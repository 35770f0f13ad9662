"""PyTorch's NCCL flight recorder on GPU workers: each rank keeps its last collectives in a ring buffer and,
when a collective times out, dumps it (which collective each rank was in, with which sizes and sequence
numbers) to a file per rank. raytrain turns it on for jobs with CUDA workers and points the dumps into the
run's record (``<storage>/<run>/raytrain/nccl/rank-N``), beside the rank logs; `jobs logs` and `jobs stack`
list them. A variable the job's ``--env`` (or a KubeRay profile's runtime env) sets is left as given.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from raytrain import run_record

TRACE_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # entries each rank keeps (0: the recorder is off)
DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
DUMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # a prefix: torch appends the rank
BUFFER_ENTRIES = 2000  # about a few hundred bytes each, on the host: a few steps of a large ZeRO-3 model
FOLDER = "nccl"
# Where the storage is not a path (a URI, or Ray's default): each node's own disk.
NODE_LOCAL = "/tmp/raytrain-nccl"


def dump_prefix(storage: str | None, run_name: str) -> str:
    folder = run_record.record_dir(storage, run_name)
    if folder is not None:
        return str(folder / FOLDER / "rank-")
    return f"{NODE_LOCAL}/{run_name}/rank-"


def env_vars(plan: Any, run_name: str, given: Iterable[str] = ()) -> dict[str, str]:
    """The recorder's variables for ``plan``'s workers: none for CPU workers; ``given`` (names the user sets) kept."""
    if not plan.scaling.use_gpu:
        return {}
    chosen = {TRACE_BUFFER: str(BUFFER_ENTRIES), DUMP_ON_TIMEOUT: "1", DUMP_FILE: dump_prefix(plan.storage, run_name)}
    given = set(given)
    return {k: v for k, v in chosen.items() if k not in given}


def prepare(environ: dict) -> Path | None:
    """On a worker: the dump's folder made (torch writes the file but not its folder); the folder, or None."""
    prefix = environ.get(DUMP_FILE)
    if not prefix or not environ.get(DUMP_ON_TIMEOUT):
        return None
    folder = Path(prefix).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # no dump is no reason to fail the job
        return None
    return folder


def dumps(record: Path | None) -> list[Path]:
    """The run's flight-recorder dumps (one file per rank that dumped)."""
    if record is None or not (record / FOLDER).is_dir():
        return []
    return sorted(p for p in (record / FOLDER).iterdir() if p.is_file())
