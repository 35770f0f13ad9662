"""The driver's side of ``--data``: read each dataset with Ray Data, run the job's ``preprocess(dataset, ctx)``
as Ray Data transforms, and materialize the result once, in a deterministic order, before the workers start.

Why materialize before training: every worker then iterates the same rows in the same order (the blocks sit in
the object store, spilled to disk when they do not fit), which is what makes the per-rank shards disjoint,
exactly-once per epoch and resumable at any row (raytrain.runtime.data). Preprocessing runs once, on the
cluster's CPUs while the training workers do not hold them yet: on a small cluster, Ray Data tasks started
while the workers hold every CPU would wait forever.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class DataError(Exception):
    """A dataset that cannot be trained on (empty, too small, unreadable): one line for the user."""


@dataclass
class PreprocessContext:
    """What a job's ``preprocess(dataset, ctx)`` is told: which dataset, the job's arguments, the batch."""

    name: str  # the dataset's --data NAME
    path: str = ""  # its PATH (absolute where local)
    args: list[str] = field(default_factory=list)  # the JOB_ARGS after --
    micro_batch: int = 1
    train_batch: int = 1
    data_parallel: int = 1


def quiet_ray_data() -> None:
    """No progress bars or execution banners in the job's log (raytrain shows progress itself)."""
    import logging

    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True  # the same rows in the same order on every run
    for attr in ("print_on_execution_start", "enable_operator_progress_bars"):
        if hasattr(ctx, attr):
            setattr(ctx, attr, False)
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def read(spec: dict[str, str]) -> Any:
    """One ``--data`` entry as a Ray Dataset (lazy)."""
    import ray.data

    path, fmt = spec["path"], spec["format"]
    if fmt == "json":
        return ray.data.read_json(path, file_extensions=None if "*" in path else ["json", "jsonl"])
    if fmt == "parquet":
        return ray.data.read_parquet(path)
    if fmt == "csv":
        return ray.data.read_csv(path)
    if fmt == "text":
        return ray.data.read_text(path)
    if fmt == "hf":  # a datasets.save_to_disk folder: Arrow files the datasets library knows how to open
        try:
            import datasets
        except ImportError:
            raise DataError(f"--data {spec['name']}={path} is a Hugging Face save_to_disk folder: reading it needs "
                            "the datasets package where the job runs (pip install 'raytrain[hf]')") from None

        return ray.data.from_huggingface(datasets.load_from_disk(path))
    raise DataError(f"--data {spec['name']}={path}: unknown format {fmt!r}")


def build(plan: Any, preprocess: Callable[[Any, PreprocessContext], Any] | None) -> dict[str, Any]:
    """Every ``--data`` dataset read, preprocessed and materialized: {name: MaterializedDataset}."""
    quiet_ray_data()
    dp = int(plan.parallel["dp"])
    micro = int(plan.deepspeed["train_micro_batch_size_per_gpu"])
    out = {}
    for spec in plan.data:
        where = f"--data {spec['name']}={spec['path']}"
        try:
            ds = read(spec)
        except DataError:
            raise
        except Exception as exc:  # unreadable files: Ray Data's own message, in one line
            raise DataError(f"{where}: cannot read as {spec['format']}: {_first_line(exc)}") from exc
        if preprocess is not None:
            info = PreprocessContext(
                name=spec["name"], path=spec["path"], args=list(plan.job_args), micro_batch=micro, train_batch=plan.train_batch,
                data_parallel=dp,
            )
            ds = preprocess(ds, info)
        try:
            ds = ds.materialize()
        except Exception as exc:
            raise DataError(f"{where}: reading/preprocessing failed: {_first_line(exc)}") from exc
        rows = ds.count()
        if rows == 0:
            raise DataError(f"{where}: the dataset is empty (after preprocessing); give a file with rows")
        if rows < dp * micro:
            raise DataError(
                f"{where}: {rows} row(s) is fewer than one micro-batch on every data-parallel rank "
                f"({dp} x {micro}); give more data or a smaller --micro-batch"
            )
        out[spec["name"]] = ds
    return out


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(exc).__name__)
    return text[:400]


def data_config() -> Any:
    """Ray Train's DataConfig for raytrain's datasets: not split by Ray (every worker iterates the whole
    materialized dataset in order and keeps its own rows: raytrain.runtime.data), order preserved."""
    from ray.data import ExecutionOptions
    from ray.train import DataConfig

    return DataConfig(datasets_to_split=[], execution_options=ExecutionOptions(preserve_order=True))
