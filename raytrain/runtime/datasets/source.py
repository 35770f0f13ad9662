"""The driver's side of ``--data``: read each dataset with Ray Data and apply the job's
``preprocess(dataset, ctx)`` as Ray Data transforms, lazily; raytrain.runtime.datasets.feed then executes the
plan once, streaming, while the workers train.

Why this design (Ray 2.60; each alternative was read in ray/data and rejected for a guarantee it breaks):

- ``streaming_split(n, equal=True)`` (Ray Train's default split) hands each output block to whichever
  rank's iterator asks first: which rank sees which row depends on timing, so shards are not deterministic
  for a seed and a position cannot be saved or re-split over another number of ranks.
- Every worker iterating the same non-materialized dataset (``DataConfig(datasets_to_split=[])``) is
  deterministic with ``preserve_order=True``, but runs the whole read + preprocess once per rank and once
  per epoch (dp x epochs times the CPU), inside the workers' own processes.
- ``materialize()`` before the workers start (raytrain before this change) is deterministic and runs the
  transforms once, but training waits for the whole dataset (the ``data_ready`` phase grew with it).

raytrain executes the plan ONCE per job, with ``preserve_order=True``, in a Feeder actor that keeps the
output blocks' refs in order; each worker fetches only the blocks of its share as soon as they exist, later
epochs and restarted attempts read the same cached blocks. The driver only waits for one global micro-batch
of rows. So: streaming, preprocessing once, one block order (raytrain.runtime.datasets.batches deals the disjoint,
exactly-once, resumable shards from it; blocks of about 1/64 of the dataset, ``block_bytes``, so there are
enough to deal). The cache costs what ``materialize()`` cost: the dataset in the object store
(spilled to disk when it does not fit).

CPUs: Ray Data's read and map tasks ask for 1 CPU by default. When the training workers leave less than
one CPU free (2 workers x 1 CPU on a 2-CPU cluster, or another job holds the rest: what counts is what is free,
``spare_cpus``), such a task could only run before the workers take the
CPUs: the read then asks for 0 CPUs, ``preprocess`` gets ``ctx.task_args == {"num_cpus": 0}`` to pass to its
transforms, and a dataset whose plan still asks for a CPU is produced whole before the workers start
(``cpus_per_task``), as before, instead of hanging.
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
    # Ray remote args for the transforms (``dataset.map_batches(fn, **ctx.task_args)``): {"num_cpus": 0} when
    # the training workers hold every CPU of the cluster, so the transforms can stream beside them.
    task_args: dict = field(default_factory=dict)


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


MAX_BLOCK_BYTES, MIN_BLOCK_BYTES, BLOCKS_WANTED = 32 << 20, 1 << 20, 64


def block_bytes(spec: dict[str, str]) -> int:
    """The largest block the read and the transforms make of a dataset (Ray Data's target_max_block_size): about
    1/BLOCKS_WANTED of a local dataset, between 1 and 32 MiB. A rank fetches whole blocks, so a dataset in a
    few big blocks (Ray Data's default: up to 128 MiB; its read puts many small files in one) could not be
    shared out, and a worker holds two blocks at a time. 32 MiB where the size is unknown (a URI)."""
    from raytrain.config.data import _files, _of_format, is_uri

    if is_uri(spec["path"]):
        return MAX_BLOCK_BYTES
    size = sum(f.stat().st_size for f in _of_format(_files(spec["path"]), spec["format"]))
    return int(min(max(size // BLOCKS_WANTED, MIN_BLOCK_BYTES), MAX_BLOCK_BYTES))


def read(spec: dict[str, str], task_args: dict[str, Any] | None = None) -> Any:
    """One ``--data`` entry as a Ray Dataset (lazy); ``task_args``: the read tasks' Ray remote args."""
    import ray.data

    from ray.data import DataContext

    path, fmt, remote = spec["path"], spec["format"], dict(task_args or {})  # num_cpus=...: named parameters
    # a Dataset keeps the context it was made with: this block size holds for its read and its preprocess
    DataContext.get_current().target_max_block_size = block_bytes(spec)
    if fmt == "json":
        return ray.data.read_json(path, file_extensions=None if "*" in path else ["json", "jsonl"], **remote)
    if fmt == "parquet":
        return ray.data.read_parquet(path, **remote)
    if fmt == "csv":
        return ray.data.read_csv(path, **remote)
    if fmt == "text":
        return ray.data.read_text(path, **remote)
    if fmt == "hf":  # a datasets.save_to_disk folder: Arrow files the datasets library knows how to open
        try:
            import datasets
        except ImportError:
            raise DataError(f"--data {spec['name']}={path} is a Hugging Face save_to_disk folder: reading it needs "
                            "the datasets package where the job runs (pip install 'raytrain[hf]')") from None

        return ray.data.from_huggingface(datasets.load_from_disk(path))
    raise DataError(f"--data {spec['name']}={path}: unknown format {fmt!r}")


def build(plan: Any, preprocess: Callable[[Any, PreprocessContext], Any] | None,
          task_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every ``--data`` dataset read and preprocessed, lazily (nothing runs yet): {name: Dataset}.
    ``task_args``: Ray remote args for the read tasks, also handed to ``preprocess`` (``ctx.task_args``)."""
    quiet_ray_data()
    dp = int(plan.parallel["dp"])
    micro = int(plan.deepspeed["train_micro_batch_size_per_gpu"])
    out = {}
    for spec in plan.data:
        where = f"--data {spec['name']}={spec['path']}"
        try:
            ds = read(spec, task_args or {})
        except DataError:
            raise
        except Exception as exc:  # unreadable files: Ray Data's own message, in one line
            raise DataError(f"{where}: cannot read as {spec['format']}: {first_line(exc)}") from exc
        if preprocess is not None:
            info = PreprocessContext(
                name=spec["name"], path=spec["path"], args=list(plan.job_args), micro_batch=micro, train_batch=plan.train_batch,
                data_parallel=dp, task_args=dict(task_args or {}),
            )
            try:
                ds = preprocess(ds, info)
            except Exception as exc:
                raise DataError(f"{where}: the job's preprocess failed: {first_line(exc)}") from exc
        out[spec["name"]] = ds
    return out


def check_rows(where: str, rows: int, done: bool, error: str | None, dp: int, micro: int) -> str | None:
    """The one-line reason a dataset cannot be trained on, from what its feed produced (None: it can)."""
    if error:
        return error
    if done and rows == 0:
        return f"{where}: the dataset is empty (after preprocessing); give a file with rows"
    if done and rows < dp * micro:
        return (f"{where}: {rows} row(s) is fewer than one micro-batch on every data-parallel rank "
                f"({dp} x {micro}); give more data or a smaller --micro-batch")
    return None


def spare_cpus(available: float, total: float, workers: float) -> float:
    """CPUs Ray Data's tasks may ask for beside the training workers: what is FREE now (another job's holdings
    are not), less what the workers (not placed yet) will take."""
    return min(float(available), float(total)) - float(workers)


def cpus_per_task(ds: Any) -> float:
    """The most CPUs one task of ``ds``'s Ray Data plan asks for (Ray Data's default: 1)."""
    try:
        ops = list(ds._logical_plan.dag.post_order_iter())
    except AttributeError:  # another Ray Data: assume the default
        return 1.0
    need = 0.0
    for op in ops:
        args = getattr(op, "ray_remote_args", None)
        if args is not None:
            need = max(need, float(args.get("num_cpus", 1) if args.get("num_cpus") is not None else 1))
    return need


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else type(exc).__name__)
    return text[:400]
