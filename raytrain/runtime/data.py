"""``ctx.dataset(NAME)`` on a worker: this data-parallel rank's batches of a ``--data`` dataset, as torch
tensors on the worker's device, exactly once per epoch across ranks, resumable at any row.

How the rows are split (and why not Ray's ``streaming_split``): ``streaming_split`` hands blocks to whichever
rank asks first, so which rank sees which row depends on timing, and a position cannot be saved or re-split
over another number of ranks. raytrain instead streams the same blocks, in the same order, to every worker
(one execution per job, cached: raytrain.runtime.data_feed and data_source) and defines one global order
per epoch: the dataset's rows, optionally shuffled in windows of ``shuffle_window`` rows by a
generator seeded with (seed, epoch, window). The rows are taken in rounds of ``dp_size x batch_size``; rank
``r`` keeps rows ``[r*batch_size, (r+1)*batch_size)`` of each round. The position is (epoch, global rows
consumed), the same on every rank: after a restart (same or other number of ranks) the first ``rows`` rows of
the epoch's order are skipped and the rest is split over the new ranks, so nothing is skipped or repeated.
A last round smaller than ``dp_size x batch_size`` is split as evenly as possible (dropped if it has fewer
rows than ranks, so that every rank does the same number of steps).

Ray Data fetches and formats the next blocks in background threads (``prefetch_batches``); with
``--prefetch N > 0`` a thread also cuts, converts and copies the next N batches (pinned memory and a
non-blocking copy on GPU), so the step only waits when the input is slower than training. The time each
``next()`` waited is counted (``wait_s``) and reported with the step's metrics as ``data_wait_s``.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from raytrain.runtime import heartbeat

_END = object()


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _take(batch: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {k: v[start:stop] for k, v in batch.items()}


def _rows(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def rechunk(batches: Iterator[dict[str, np.ndarray]], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Numpy batches of any sizes -> batches of exactly ``size`` rows (the last may be smaller)."""
    parts: list[dict[str, np.ndarray]] = []
    have = 0
    for batch in batches:
        n = _rows(batch)
        if n == 0:
            continue
        parts.append(batch)
        have += n
        while have >= size:
            whole = _concat(parts)
            yield _take(whole, 0, size)
            rest = _take(whole, size, have)
            have -= size
            parts = [rest] if have else []
    if have:
        yield _concat(parts)


def epoch_order(batches: Iterator[dict[str, np.ndarray]], *, shuffle: bool, seed: int, epoch: int,
                window: int) -> Iterator[dict[str, np.ndarray]]:
    """The epoch's global row order: the dataset's order, or shuffled within windows of ``window`` rows by a
    generator seeded with (seed, epoch, window index): the same on every rank and every run."""
    if not shuffle:
        yield from batches
        return
    for i, chunk in enumerate(rechunk(batches, window)):
        perm = np.random.default_rng([seed, epoch, i]).permutation(_rows(chunk))
        yield {k: v[perm] for k, v in chunk.items()}


def skip_rows(batches: Iterator[dict[str, np.ndarray]], rows: int) -> Iterator[dict[str, np.ndarray]]:
    """``batches`` without their first ``rows`` rows."""
    for batch in batches:
        n = _rows(batch)
        if rows >= n:
            rows -= n
            continue
        yield _take(batch, rows, n) if rows else batch
        rows = 0


def my_part(round_: dict[str, np.ndarray], *, rank: int, size: int, batch_size: int) -> dict[str, np.ndarray] | None:
    """Rank ``rank``'s rows of one round of ``size x batch_size`` rows (a short last round split evenly;
    None when it has fewer rows than ranks: dropped by every rank alike)."""
    n = _rows(round_)
    if n == size * batch_size:
        return _take(round_, rank * batch_size, (rank + 1) * batch_size)
    if n < size:
        return None
    bounds = np.linspace(0, n, size + 1).astype(int)  # array_split's boundaries
    return _take(round_, int(bounds[rank]), int(bounds[rank + 1]))


def numeric(value: Any) -> Any:
    """A column of equal-length numeric lists (JSON arrays, Arrow list columns) as one 2-D+ array."""
    if isinstance(value, np.ndarray) and value.dtype == object and len(value):
        first = value[0]
        if isinstance(first, (np.ndarray, list, tuple)):
            try:
                stacked = np.stack([np.asarray(v) for v in value])
            except ValueError:  # ragged: leave as objects
                return value
            if stacked.dtype.kind in "biuf":
                return stacked
    return value


class Position:
    """Where a dataset's iteration is: epoch, and global rows of that epoch's order already handed out."""

    def __init__(self, epoch: int = 0, rows: int = 0):
        self.epoch, self.rows = int(epoch), int(rows)

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "rows": self.rows}


class ShardBatches:
    """An iterable over this rank's batches, epoch after epoch from ``position``; see the module doc."""

    def __init__(self, source: Any, *, rank: int, size: int, batch_size: int, position: Position,
                 epochs: int | None = None, shuffle: bool = False, seed: int = 0, shuffle_window: int = 10_000,
                 prefetch: int = 2, device: Any = None, map_batches: Callable | None = None,
                 columns: list[str] | None = None):
        if batch_size < 1:
            raise ValueError(f"ctx.dataset: batch_size must be >= 1, got {batch_size}")
        self.source, self.rank, self.size, self.batch_size = source, rank, size, batch_size
        self.position, self.epochs = position, epochs
        self.shuffle, self.seed, self.window = shuffle, seed, max(int(shuffle_window), 1)
        self.prefetch, self.device, self.map_batches, self.columns = prefetch, device, map_batches, columns
        self.wait_s = 0.0  # total time next() waited for a batch
        self.batches = 0

    # -- producing (possibly in the prefetch thread) --------------------------------------------------
    def _epoch_rounds(self, epoch: int, start: int) -> Iterator[tuple[dict | None, int]]:
        """(this rank's part, rows of the epoch consumed after it) for each round from row ``start``."""
        rnd = self.size * self.batch_size
        stream = self.source.iter_batches(
            batch_size=rnd, batch_format="numpy", prefetch_batches=self.prefetch, drop_last=False
        )
        if self.columns:
            stream = (self._select(b) for b in stream)
        ordered = epoch_order(stream, shuffle=self.shuffle, seed=self.seed, epoch=epoch, window=self.window)
        consumed = start
        for round_ in rechunk(skip_rows(ordered, start), rnd):
            consumed += _rows(round_)
            yield my_part(round_, rank=self.rank, size=self.size, batch_size=self.batch_size), consumed

    def _select(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [c for c in self.columns if c not in batch]
        if missing:
            raise KeyError(
                f"ctx.dataset: column(s) {', '.join(missing)} not in the dataset (it has {', '.join(batch)})"
            )
        return {c: batch[c] for c in self.columns}

    def _produce(self) -> Iterator[tuple[Any, int, int]]:
        """(torch batch, epoch, rows consumed) for every batch this rank gets from the position on."""
        epoch, start = self.position.epoch, self.position.rows
        while self.epochs is None or epoch < self.epochs:
            for part, consumed in self._epoch_rounds(epoch, start):
                if part is not None:
                    yield self._to_torch(part), epoch, consumed
            epoch, start = epoch + 1, 0
            yield None, epoch, 0  # the epoch ended: the position moves on even if the last round was dropped

    def _to_torch(self, part: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        if self.map_batches is not None:
            part = self.map_batches(part)
        cuda = getattr(self.device, "type", "cpu") == "cuda"
        out = {}
        for key, value in part.items():
            value = numeric(value)
            if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                tensor = torch.from_numpy(np.array(value, copy=not value.flags.writeable or None, order="C"))
                if cuda:
                    tensor = tensor.pin_memory().to(self.device, non_blocking=True)
                elif self.device is not None:
                    tensor = tensor.to(self.device)
                out[key] = tensor
            elif isinstance(value, torch.Tensor):
                out[key] = value.to(self.device) if self.device is not None else value
            else:
                out[key] = list(value)  # strings and other objects stay Python values
        return out

    # -- consuming -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        items = self._prefetched() if self.prefetch > 0 else self._produce()
        while True:
            started = time.perf_counter()
            heartbeat.STATE.enter("data")
            item = next(items, _END)
            self.wait_s += time.perf_counter() - started
            if item is _END:
                return
            batch, epoch, consumed = item
            self.position.epoch, self.position.rows = epoch, consumed
            if batch is not None:
                self.batches += 1
                yield batch

    def _prefetched(self) -> Iterator[tuple[Any, int, int]]:
        """``_produce`` run ``prefetch`` items ahead in a daemon thread; its errors are raised here."""
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def run() -> None:
            try:
                for item in self._produce():
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.5)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(_END)
            except BaseException as exc:  # handed to the consumer
                q.put(exc)

        thread = threading.Thread(target=run, name="raytrain-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
