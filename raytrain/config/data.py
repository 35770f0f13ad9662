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
    workers' side. Mirrors raytrain.runtime.data_source/data_feed (the driver) and runtime.data (workers)."""
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
            f"each of {dp} data-parallel rank(s) takes its own rows of one seeded global order (ctx.dataset), "
            f"prefetch {prefetch} batch(es) ahead" + (" of the step" if prefetch else ": off")
        ),
        "prefetch": prefetch,
    }


def describe(datasets: list[dict[str, str]]) -> list[str]:
    """One line per dataset, for --dry-run."""
    return [f"{d['name']}: {redact.text(d['path'])} ({d['format']})" for d in datasets]
