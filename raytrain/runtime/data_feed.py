"""One Ray Data execution per ``--data`` dataset, streamed to every worker in one fixed order and cached.

The driver starts a ``Feeder`` actor (0 CPUs) per dataset: it runs the dataset's Ray Data plan (read + the
job's ``preprocess``) once, streaming, with ``preserve_order=True``, and keeps the output blocks' object refs
in the order Ray Data produced them. Workers (``FeedSource``) read the blocks by index as soon as they exist:
training starts when the first blocks are ready, while Ray Data tasks keep producing the rest on the
cluster's CPUs. The second and later epochs, and the workers of a restarted attempt, read the cached blocks
(preprocessing runs once per job, never on a worker, never once per rank). Every worker sees the same rows
in the same order, which is what raytrain.runtime.data's disjoint, exactly-once, resumable shards need.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator

_POLL_S = 30.0  # how long one blocks() call waits for new blocks before the worker asks again


class Feed:
    """The Feeder actor's state (plain Python, so it can be tested without an actor)."""

    def __init__(self, where: str):
        self.where = where
        self.blocks: list[tuple[Any, int, int | None]] = []  # (block ref, first row, end row or None: to the end)
        self.rows = 0  # rows produced so far
        self.done = False
        self.error: str | None = None
        self.cond = threading.Condition()

    def add(self, ref: Any, start: int, stop: int | None, rows: int) -> None:
        with self.cond:
            self.blocks.append((ref, start, stop))
            self.rows += rows
            self.cond.notify_all()

    def finish(self, error: str | None = None) -> None:
        with self.cond:
            self.done, self.error = True, error
            self.cond.notify_all()

    def wait(self, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not (ready() or self.done) and time.monotonic() < deadline:
                self.cond.wait(max(0.0, min(1.0, deadline - time.monotonic())))

    def since(self, index: int, timeout: float) -> tuple[list, bool, str | None]:
        """The blocks from ``index`` on (waiting up to ``timeout`` for one), whether that is all, the error."""
        self.wait(lambda: len(self.blocks) > index, timeout)
        with self.cond:
            return list(self.blocks[index:]), self.done, self.error

    def progress(self, rows: int, timeout: float) -> tuple[int, bool, str | None]:
        """(rows so far, done, error) once ``rows`` rows exist or the stream ended (or ``timeout`` passed)."""
        self.wait(lambda: self.rows >= rows, timeout)
        with self.cond:
            return self.rows, self.done, self.error


def run_stream(feed: Feed, dataset: Any) -> None:
    """Execute ``dataset`` (streaming, order preserved) into ``feed``; an error ends the feed with one line."""
    from raytrain.runtime.data_source import first_line, quiet_ray_data

    quiet_ray_data()
    try:
        for bundle in dataset.iter_internal_ref_bundles():
            for entry, cut in zip(bundle.blocks, bundle.slices):
                if cut is not None:
                    feed.add(entry.ref, cut.start_offset, cut.end_offset, cut.num_rows)
                else:
                    feed.add(entry.ref, 0, None, int(entry.metadata.num_rows or 0))
        feed.finish()
    except Exception as exc:
        feed.finish(f"{feed.where}: reading/preprocessing failed: {first_line(exc)}")


class Feeder:
    """The actor (see the module doc). Threaded: every worker can wait for blocks at the same time."""

    def __init__(self, dataset: Any, where: str):
        self.feed = Feed(where)
        threading.Thread(target=run_stream, args=(self.feed, dataset), name="raytrain-feed", daemon=True).start()

    def since(self, index: int, timeout: float = _POLL_S) -> tuple[list, bool, str | None]:
        return self.feed.since(index, timeout)

    def progress(self, rows: int, timeout: float = _POLL_S) -> tuple[int, bool, str | None]:
        return self.feed.progress(rows, timeout)


def actor_name(job_id: str, name: str) -> str:
    return f"raytrain-data-{job_id}-{name}"


NAMESPACE = "raytrain"


def start_feeder(dataset: Any, name: str, where: str) -> Any:
    """A Feeder actor for one dataset of this Ray job, on the driver's node, named for the workers to find."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    job_id = ray.get_runtime_context().get_job_id()
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor = ray.remote(num_cpus=0, max_concurrency=64, scheduling_strategy=here)(Feeder)
    return actor.options(name=actor_name(job_id, name), namespace=NAMESPACE).remote(dataset, where)


class FeedSource:
    """A worker's view of one Feeder: ``iter_batches`` yields the dataset's blocks as numpy dicts, in order
    (any sizes: raytrain.runtime.data cuts them), fetching the next ``prefetch`` blocks ahead."""

    def __init__(self, name: str, handle: Any = None):
        import ray

        self.name = name
        self.handle = handle or ray.get_actor(actor_name(ray.get_runtime_context().get_job_id(), name),
                                              namespace=NAMESPACE)

    def iter_batches(self, *, prefetch_batches: int = 1, **_: Any) -> Iterator[dict]:
        import ray

        index = 0
        while True:
            blocks, done, error = ray.get(self.handle.since.remote(index))
            if error:
                from raytrain.runtime.data_source import DataError

                raise DataError(error)
            if not blocks and done:
                return
            refs = [ref for ref, _, _ in blocks]
            for k, (ref, start, stop) in enumerate(blocks):
                ahead = refs[k + 1:k + 1 + max(int(prefetch_batches), 0)]
                if ahead:  # start pulling the next blocks to this node while this one is used
                    ray.wait(ahead, num_returns=len(ahead), timeout=0, fetch_local=True)
                yield to_numpy(ray.get(ref), start, stop)
            index += len(blocks)


def to_numpy(block: Any, start: int, stop: int | None) -> dict:
    """One Ray Data block (Arrow or pandas) rows [start, stop) as {column: numpy array}, as iter_batches
    would give it."""
    from ray.data.block import BlockAccessor

    acc = BlockAccessor.for_block(block)
    if start or stop is not None:
        acc = BlockAccessor.for_block(acc.slice(start, acc.num_rows() if stop is None else stop, copy=False))
    return acc.to_batch_format("numpy")
