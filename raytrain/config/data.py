"""``--data NAME=PATH`` and ``--data-format``: which datasets a job reads, in which format (pure, no Ray).

A PATH is a file, a folder, a glob, or a URI (``s3://``, ``gs://``, ...). The format comes from the file
extension (``.jsonl``/``.json``, ``.parquet``, ``.csv``, ``.txt``), from a folder written by Hugging Face
``datasets``' ``save_to_disk`` (``dataset_info.json`` + ``*.arrow``), or from ``--data-format``. Local
paths the CLI can see are checked before submitting; a URI is read by the cluster.
"""
from __future__ import annotations

import ast
import glob as globlib
import re
from pathlib import Path

from raytrain import redact
from raytrain.errors import ConfigError

FORMATS = ("json", "parquet", "csv", "text", "hf")
EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
HF_MARKERS = ("dataset_info.json", "state.json")


def parse_data_pairs(pairs: tuple[str, ...] | list[str] | dict) -> dict[str, str]:
    """``--data NAME=PATH`` (repeatable), or a profile's ``data: {train: PATH}`` -> {NAME: PATH}."""
    if isinstance(pairs, dict):
        return {str(k): str(v) for k, v in pairs.items()}
    data: dict[str, str] = {}
    for pair in pairs or ():
        name, sep, path = str(pair).partition("=")
        if not sep or "/" in name or ":" in name:  # a bare PATH (a URI's query may hold '=') is the training set
            name, path = "train", str(pair)
        if not name or not path:
            raise ConfigError(f"--data {redact.text(pair)}: expected NAME=PATH, e.g. --data train=corpus.jsonl", flag="--data")
        if name in data:
            raise ConfigError(f"--data {redact.text(pair)}: dataset {name!r} given twice", flag="--data")
        data[name] = path
    return data


def is_uri(path: str) -> bool:
    return "://" in path


def _format_of_files(spec: str, files: list[str]) -> str:
    formats = {EXTENSIONS.get(Path(f).suffix.lower()) for f in files if not Path(f).name.startswith((".", "_"))}
    if None in formats:
        formats.discard(None)
        if not formats:
            suffixes = sorted({Path(f).suffix or "(none)" for f in files})[:5]
            raise ConfigError(
                f"--data {redact.text(spec)}: unknown format (extensions {', '.join(suffixes)}); give --data-format "
                f"{'|'.join(FORMATS)}", flag="--data-format",
            )
    if len(formats) > 1:
        raise ConfigError(
            f"--data {redact.text(spec)}: ambiguous format (files of {', '.join(sorted(formats))}); keep one format per "
            f"dataset or give --data-format", flag="--data-format",
        )
    return formats.pop()


def detect_format(name: str, path: str) -> str:
    """The format of ``path`` from what it is (checked where the CLI can see it)."""
    spec = f"{name}={path}"
    if is_uri(path):
        from urllib.parse import urlsplit

        fmt = EXTENSIONS.get(Path(urlsplit(path).path.rstrip("/")).suffix.lower())  # a signed URL's query aside
        if fmt is None:
            raise ConfigError(
                f"--data {redact.text(spec)}: cannot tell the format of a URI without an extension; give --data-format "
                f"{'|'.join(FORMATS)}", flag="--data-format",
            )
        return fmt
    p = Path(path)
    if any(ch in path for ch in "*?["):
        files = [f for f in globlib.glob(path, recursive=True) if Path(f).is_file()]
        if not files:
            raise ConfigError(f"--data {redact.text(spec)}: no file matches the pattern", flag="--data")
        return _format_of_files(spec, files)
    if p.is_file():
        return _format_of_files(spec, [path])
    if p.is_dir():
        if any((p / m).is_file() for m in HF_MARKERS) and list(p.glob("*.arrow")):
            return "hf"
        files = [str(f) for f in p.rglob("*") if f.is_file()]
        if not files:
            raise ConfigError(f"--data {redact.text(spec)}: the folder is empty", flag="--data")
        return _format_of_files(spec, files)
    raise ConfigError(
        f"--data {redact.text(spec)}: no such file or folder; give an existing path, a glob, or a URI the cluster can read "
        "(s3://, gs://, a shared file system)", flag="--data",
    )


def resolve_data(data: dict[str, str] | None, data_format: str | None) -> list[dict[str, str]]:
    """The datasets for the Plan: [{"name", "path", "format"}], local paths made absolute."""
    if data_format is not None and data_format not in FORMATS:
        raise ConfigError(f"--data-format {data_format}: use one of {', '.join(FORMATS)}", flag="--data-format")
    if data_format is not None and not data:
        raise ConfigError("--data-format needs --data NAME=PATH", flag="--data-format")
    out = []
    for name, path in (data or {}).items():
        if not NAME_RE.match(name):
            raise ConfigError(
                f"--data {name}={redact.text(path)}: name {name!r} must be a word (letters, digits, '_' or '-'), e.g. train",
                flag="--data",
            )
        fmt = data_format or detect_format(name, path)
        if not is_uri(path) and not any(ch in path for ch in "*?["):
            if not Path(path).exists():
                raise ConfigError(f"--data {name}={redact.text(path)}: no such file or folder", flag="--data")
            path = str(Path(path).resolve())
        elif not is_uri(path):
            path = str(Path(path).absolute())
        out.append({"name": name, "path": path, "format": fmt})
    return out


def defines_preprocess(job_file: str) -> bool:
    """Whether the job file defines a top-level ``preprocess(dataset, ctx)`` (read, not imported)."""
    try:
        tree = ast.parse(Path(job_file).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == "preprocess" for n in tree.body)


def data_plan(datasets: list[dict[str, str]], *, preprocess: bool, prefetch: int, dp: int, micro: int,
              mode: str = "train") -> dict:
    """What runs where for ``--data`` (for --dry-run): the datasets, the preprocessing, the streaming, the
    workers' side. Mirrors raytrain.runtime.datasets.source/data_feed (the driver) and runtime.datasets.batches (workers)."""
    steps = "read" + (" + the job's preprocess(dataset, ctx)" if preprocess and mode == "train" else "")
    return {
        "datasets": datasets,
        "preprocess": bool(preprocess and mode == "train"),
        "preprocess_where": (
            f"{steps} as Ray Data tasks on the cluster's CPUs (1 CPU a task by default, 0 when the training "
            "workers hold every CPU), run once per job by a feeder actor on the driver's node"
        ),
        "streaming": (
            f"the workers start once {dp * micro} row(s) (one micro-batch per data-parallel rank) are ready; "
            "the rest streams while they train and is cached in the object store for later epochs and restarts "
            "(all rows first if a transform asks for a CPU that only the workers' reservation has)"
        ),
        "workers": (
            f"each of {dp} data-parallel rank(s) reads only its own share of the blocks (ctx.dataset), "
            f"prefetch {prefetch} batch(es) ahead" + (" of the step" if prefetch else ": off")
        ),
        "prefetch": prefetch,
        "read_per_rank": [share(measure(d), dp) for d in datasets],
    }


_COUNT_LIMIT = 256 << 20  # line-based files up to this size are counted; larger ones estimated from a sample


def _files(path: str) -> list[Path]:
    p = Path(path)
    if any(ch in path for ch in "*?["):
        return sorted(Path(f) for f in globlib.glob(path, recursive=True) if Path(f).is_file())
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
    return [p] if p.is_file() else []


def _of_format(files: list[Path], fmt: str) -> list[Path]:
    """The files a format's reader takes (a folder can hold others: a README, a manifest)."""
    mine = [f for f in files if EXTENSIONS.get(f.suffix.lower()) == fmt]
    return mine or files


def _lines(f: Path, size: int) -> tuple[int, bool]:
    """Lines of a text file: counted, or (larger than _COUNT_LIMIT) estimated from its first 4 MiB."""
    with open(f, "rb") as fh:
        if size <= _COUNT_LIMIT:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")), True
        head = fh.read(4 << 20)
    return int(head.count(b"\n") * size / max(len(head), 1)), False


def measure(spec: dict[str, str]) -> dict:
    """A dataset's rows and bytes as its files tell, without reading them through Ray: Parquet footers (rows,
    and the uncompressed size of the row groups), line counts for JSON Lines/CSV/text, the Arrow files'
    metadata of a save_to_disk folder. {"rows", "bytes", "source"}; None where it cannot be known here (a URI:
    the cluster reads it)."""
    path, fmt = spec["path"], spec["format"]
    if is_uri(path):
        return {"rows": None, "bytes": None, "source": "a URI: read on the cluster"}
    files = _of_format(_files(path), fmt)
    rows: int | None = 0
    size, exact = 0, True
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            for f in files:
                meta = pq.ParquetFile(f).metadata
                rows += meta.num_rows
                size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            return {"rows": rows, "bytes": size, "source": "Parquet footers (bytes: uncompressed)"}
        if fmt == "hf":
            import pyarrow as pa

            for f in sorted(Path(path).glob("*.arrow")):
                with pa.memory_map(str(f)) as source:
                    table = pa.ipc.open_stream(source).read_all()
                rows += table.num_rows
                size += table.nbytes
            return {"rows": rows, "bytes": size, "source": "the Arrow files"}
        for f in files:
            n = f.stat().st_size
            size += n
            lines, counted = _lines(f, n)
            exact = exact and counted
            rows += max(lines - (1 if fmt == "csv" else 0), 0)
        return {"rows": rows, "bytes": size, "source": "line counts" if exact else "line counts (estimated)"}
    except Exception as exc:  # an unreadable footer: the job's own read will say what is wrong
        return {"rows": None, "bytes": None, "source": f"unknown ({type(exc).__name__}: {str(exc)[:80]})"}


def share(measured: dict, dp: int) -> dict:
    """What each data-parallel rank reads of a measured dataset per epoch: about 1/dp of its rows and bytes
    (each rank fetches only the blocks of its share; a piece's edge blocks can be fetched by two ranks)."""
    rows, size = measured.get("rows"), measured.get("bytes")
    return {**measured, "ranks": dp,
            "rows_per_rank": None if rows is None else -(-rows // dp),
            "bytes_per_rank": None if size is None else -(-size // dp)}


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def describe_share(name: str, read: dict) -> str:
    """--dry-run's line for one dataset's per-rank reading."""
    if read.get("rows") is None:
        return f"{name}: rows and bytes per rank unknown before the job reads it ({read['source']})"
    return (f"{name}: each of {read['ranks']} rank(s) reads ~{read['rows_per_rank']:,} of {read['rows']:,} rows, "
            f"~{_size(read['bytes_per_rank'])} of {_size(read['bytes'])} per epoch (from {read['source']}; "
            "rows before the job's preprocess)")


def describe(datasets: list[dict[str, str]]) -> list[str]:
    """One line per dataset, for --dry-run."""
    return [f"{d['name']}: {redact.text(d['path'])} ({d['format']})" for d in datasets]
