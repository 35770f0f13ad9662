"""``ctx.dataset(NAME)`` on a worker: this data-parallel rank's batches of a ``--data`` dataset, as torch
tensors on the worker's device, exactly once per epoch across ranks, resumable at any row.

How the rows are split (and why not Ray's ``streaming_split``): ``streaming_split`` hands blocks to whichever
rank asks first, so which rank sees which row depends on timing, and a position cannot be saved or re-split
over another number of ranks. raytrain's Feeder executes the dataset once per job and keeps its blocks in a
fixed order (raytrain.runtime.datasets.feed); each rank reads only the blocks of its own share:

- An epoch's rows are dealt in rounds of ``n x C`` rows (n ranks; ``C``, a piece: a whole number of batches
  covering about eight of the dataset's blocks, ``piece_rows``): rank r takes one piece of C consecutive rows
  of each round (which piece: shuffled per round with ``shuffle=True``), so it fetches about 1/n of the
  blocks (a piece's first and last block can be shared with a neighbour). The rest of the epoch (fewer than
  ``n x C`` rows) goes in n contiguous chunks of whole batches, then the last rows (fewer than
  ``n x batch_size``) one short batch each, split evenly (dropped when fewer than n: every rank does the same
  number of steps). Inside a piece the rows are read in windows of ``shuffle_window`` rows, each permuted by a
  generator seeded with (seed, epoch, phase, round, piece, window) when ``shuffle=True``.
- Every rank consumes its rows in lockstep (one batch per micro-step), so a position is the same on every
  rank: (epoch, and per phase: ranks, batch size, piece size, rows each rank consumed). Restored on the same
  number of ranks it continues each rank's share bit for bit; on another number (a restart after a resize,
  ``--resume`` on fewer workers) a new phase re-splits exactly the rows no rank consumed, by the same rule.
  Nothing is skipped or repeated; every assignment is a function of (dataset, seed, epoch, ranks, position).

The next blocks of a rank's share are pulled to its node ahead (``--prefetch`` blocks); with
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

from raytrain.runtime.worker import heartbeat

_END = object()
ROW, POS = "__raytrain_row__", "__raytrain_pos__"  # hidden columns: global row id; position in the rank's phase


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


class Seq:
    """An ordered sequence of the dataset's global row indices: ranges ``(start, stop)`` and index arrays;
    only the last segment may be open (``stop=None``: to the dataset's end, which may not be known yet)."""

    def __init__(self, segments: list):
        self.segments = [s for s in segments if not _empty(s)]

    def closed_len(self) -> int:
        return sum(_seg_len(s) for s in self.segments if not _open(s))

    def open_start(self) -> int | None:
        return self.segments[-1][0] if self.segments and _open(self.segments[-1]) else None

    def length(self, total: int | None) -> int | None:
        """Rows in all (``total``: the dataset's rows, None while unknown -> None for an open sequence)."""
        start = self.open_start()
        if start is None:
            return self.closed_len()
        return None if total is None else self.closed_len() + max(total - start, 0)

    def slice(self, a: int, b: int | None) -> "Seq":
        """Rows ``[a, b)`` of this sequence (``b=None``: to its end)."""
        out, pos = [], 0
        for seg in self.segments:
            n = None if _open(seg) else _seg_len(seg)
            lo, hi = max(a - pos, 0), None if b is None else b - pos
            if n is not None and lo >= n:
                pos += n
                continue
            if hi is not None and hi <= 0:
                break
            if isinstance(seg, np.ndarray):
                out.append(seg[lo:hi])
            else:
                stop = seg[1] if hi is None or (n is not None and hi >= n) else seg[0] + hi
                out.append((seg[0] + lo, stop))
            if n is None:
                break
            pos += n
        return Seq(out)

    def indices(self, local: np.ndarray) -> np.ndarray:
        """The global rows at positions ``local`` of this (closed) sequence."""
        flat = np.concatenate([s if isinstance(s, np.ndarray) else np.arange(s[0], s[1]) for s in self.segments]
                              or [np.zeros(0, dtype=np.int64)])
        return flat[local]

    def to_list(self) -> list:
        return [s.tolist() if isinstance(s, np.ndarray) else [s[0], s[1]] for s in self.segments]


def _open(seg) -> bool:
    return not isinstance(seg, np.ndarray) and seg[1] is None


def _seg_len(seg) -> int:
    return len(seg) if isinstance(seg, np.ndarray) else seg[1] - seg[0]


def _empty(seg) -> bool:
    return (len(seg) == 0) if isinstance(seg, np.ndarray) else (seg[1] is not None and seg[1] <= seg[0])


PIECE_BLOCKS = 8


def piece_rows(first_block_rows: int, batch_size: int) -> int:
    """How many consecutive rows a rank takes at a time (a multiple of the batch size): eight of the dataset's
    blocks, so that each rank fetches about 1/N of the blocks (a piece's edge blocks may be shared: a piece
    not aligned to the blocks touches nine, 9/16 of the dataset at 2 ranks)."""
    target = max(PIECE_BLOCKS * int(first_block_rows), batch_size)
    return -(-target // batch_size) * batch_size


class Phase:
    """Part of an epoch read by one number of ranks: ``n`` ranks, ``bs`` rows per batch, pieces of ``C`` rows,
    ``u`` rows consumed by each rank so far (the same on every rank: they consume in lockstep)."""

    def __init__(self, n: int, bs: int, C: int, u: int = 0):
        self.n, self.bs, self.C, self.u = int(n), int(bs), int(C), int(u)

    def to_dict(self) -> dict[str, int]:
        return {"n": self.n, "bs": self.bs, "C": self.C, "u": self.u}


class Position:
    """Where a dataset's iteration is: epoch, global rows of the epoch handed out, and the epoch's phases (one
    per number of ranks it was read with: after a resize the rest of the epoch is re-split)."""

    def __init__(self, epoch: int = 0, rows: int = 0, phases: list | None = None):
        self.epoch, self.rows = int(epoch), int(rows)
        self.phases = [p if isinstance(p, Phase) else Phase(**p) for p in (phases or [])]

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "rows": self.rows, "phases": [p.to_dict() for p in self.phases]}


class Split:
    """One phase's assignment of a sequence ``R`` of the epoch's rows to ``n`` ranks (see the module doc).

    Full rounds of ``n x C`` rows: rank r takes piece ``slot_j(r)`` of round j (slots shuffled per round when
    ``shuffle``). The rest (fewer than ``n x C`` rows, known once the dataset's end is): rank r takes the r-th
    contiguous chunk of ``q`` rows (q: whole batches, the same for all ranks), then the last rows (fewer than
    ``n x bs``) are split evenly, one short batch each, or dropped by every rank when fewer than ``n``. Rows
    inside a piece are read in windows of ``window`` rows, each permuted when ``shuffle``."""

    def __init__(self, R: Seq, phase: Phase, *, key: tuple, shuffle: bool, window: int, source: Any):
        self.R, self.phase, self.key, self.shuffle, self.window, self.source = R, phase, key, shuffle, window, source

    def _has(self, rows: int) -> bool:
        """Whether R holds at least ``rows`` rows (waiting for the dataset's stream as far as needed)."""
        start = self.R.open_start()
        if start is None:
            return self.R.closed_len() >= rows
        need = start + rows - self.R.closed_len()
        return self.source.rows_at_least(need) >= need

    def _slots(self, j: int) -> np.ndarray:
        n = self.phase.n
        return np.random.default_rng([*self.key, j]).permutation(n) if self.shuffle else np.arange(n)

    def pieces(self, rank: int) -> Iterator[tuple[Seq, tuple]]:
        """Rank ``rank``'s pieces (rows, shuffle key) in the order it reads them."""
        n, C, bs = self.phase.n, self.phase.C, self.phase.bs
        j = 0
        while self._has((j + 1) * n * C):
            slot = int(self._slots(j)[rank])
            yield self.R.slice((j * n + slot) * C, (j * n + slot + 1) * C), (*self.key, j, slot)
            j += 1
        total = self.R.length(self.source.total())
        base = j * n * C
        m = total - base
        q = (m // (n * bs)) * bs
        if q:
            yield self.R.slice(base + rank * q, base + (rank + 1) * q), (*self.key, "tail", rank)
        rem, base2 = m - n * q, base + n * q
        if rem >= n:
            bounds = np.linspace(0, rem, n + 1).astype(int)  # array_split's boundaries
            yield self.R.slice(base2 + int(bounds[rank]), base2 + int(bounds[rank + 1])), (*self.key, "rem", rank)

    def order(self, piece: Seq, key: tuple, length: int) -> Iterator[tuple[int, Any]]:
        """A piece's windows in reading order: (first row of the window, window rows as Seq or (Seq, perm))."""
        for k, lo in enumerate(range(0, length, self.window)):
            rows = piece.slice(lo, min(lo + self.window, length))
            if self.shuffle:
                perm = np.random.default_rng([*_ints(key), k]).permutation(min(self.window, length - lo))
                yield lo, (rows, perm)
            else:
                yield lo, (rows, None)

    def rest(self) -> Seq:
        """The rows of R no rank has consumed after ``phase.u`` rows each: the next phase's R."""
        n, C, u = self.phase.n, self.phase.C, self.phase.u
        if u == 0:
            return self.R
        j, o = divmod(u, C)
        if o == 0 and self._has(j * n * C):
            return self.R.slice(j * n * C, None)
        if self._has((j + 1) * n * C):
            parts = []
            for r in range(n):
                slot = int(self._slots(j)[r])
                piece = self.R.slice((j * n + slot) * C, (j * n + slot + 1) * C)
                parts += self._unread(piece, (*self.key, j, slot), C, o)
            return Seq(parts + self.R.slice((j + 1) * n * C, None).segments)
        # the tail: u is inside each rank's chunk of q rows (the short last batch ends the epoch)
        total = self.R.length(self.source.total())
        base = j * n * C
        q = ((total - base) // (n * self.phase.bs)) * self.phase.bs
        parts = []
        for r in range(n):
            parts += self._unread(self.R.slice(base + r * q, base + (r + 1) * q), (*self.key, "tail", r), q, o)
        return Seq(parts + self.R.slice(base + n * q, None).segments)

    def _unread(self, piece: Seq, key: tuple, length: int, o: int) -> list:
        """The segments of a piece after its first ``o`` rows in reading order."""
        out = []
        for lo, (rows, perm) in self.order(piece, key, length):
            size = min(self.window, length - lo)
            if o >= lo + size:
                continue
            skip = max(o - lo, 0)
            if perm is None:
                out += rows.slice(skip, None).segments
            else:
                out.append(rows.indices(perm[skip:]))
        return out


def _ints(key: tuple) -> list[int]:
    """A shuffle key as the integers numpy's generator seeds from ("tail"/"rem" become numbers)."""
    return [{"tail": 1 << 30, "rem": 1 << 31}.get(k, k) if isinstance(k, str) else int(k) for k in key]


class ShardBatches:
    """An iterable over this rank's batches from ``position``: each ``for`` over it is ``epochs`` epochs (default
    one: the rest of the current epoch), the next ``for`` continues; ``epochs=None``: one endless stream."""

    def __init__(self, source: Any, *, rank: int, size: int, batch_size: int, position: Position,
                 epochs: int | None = 1, shuffle: bool = False, seed: int = 0, shuffle_window: int = 10_000,
                 prefetch: int = 2, device: Any = None, map_batches: Callable | None = None,
                 columns: list[str] | None = None, drop: dict[int, Any] | None = None,
                 on_batch: Callable[[int, list[int]], None] | None = None):
        if batch_size < 1:
            raise ValueError(f"ctx.dataset: batch_size must be >= 1, got {batch_size}")
        self.source, self.rank, self.size, self.batch_size = source, rank, size, batch_size
        self.position, self.epochs = position, epochs
        self.shuffle, self.seed, self.window = shuffle, seed, max(int(shuffle_window), 1)
        self.prefetch, self.device, self.map_batches, self.columns = prefetch, device, map_batches, columns
        self.wait_s = 0.0  # total time next() waited for a batch
        self.batches = 0
        # rows a rollback skips ({epoch: row ids}): dropped from this rank's rows where they come, the position
        # counts them as read; every rank drops a whole bad step's rows, so ranks stay in lockstep
        self.set_drop(drop)
        self.on_batch = on_batch  # (epoch, row ids) of each batch handed out (the guard names a bad step's rows)
        self.last_rows: list[int] = []

    def set_drop(self, drop: dict[int, Any] | None) -> None:
        self.drop = {int(e): np.asarray(sorted(ids), dtype=np.int64) for e, ids in (drop or {}).items() if len(ids)}

    # -- producing (possibly in the prefetch thread) --------------------------------------------------
    def _phases(self, phases: list[Phase]) -> list[Phase]:
        """The epoch's phases with this run's ranks as the current one (a new phase after a resize)."""
        phases = [Phase(**p.to_dict()) for p in phases]
        if phases and (phases[-1].n, phases[-1].bs) == (self.size, self.batch_size):
            return phases
        if phases and phases[-1].u == 0:
            phases.pop()
        C = piece_rows(self.source.first_block_rows(), self.batch_size)
        return phases + [Phase(self.size, self.batch_size, C)]

    def _split(self, epoch: int, phases: list[Phase]) -> Split:
        """The current (last) phase's split: the epoch's rows less what the earlier phases consumed."""
        R = Seq([(0, None)])
        for i, phase in enumerate(phases):
            split = Split(R, phase, key=(self.seed, epoch, i), shuffle=self.shuffle, window=self.window,
                          source=self.source)
            if i == len(phases) - 1:
                return split
            R = split.rest()
        raise AssertionError("no phase")

    def _epoch_batches(self, epoch: int, phases: list[Phase]) -> Iterator[tuple[dict, list[Phase]]]:
        """(this rank's batch, the phases after it) for the rest of the epoch."""
        phases = self._phases(phases)
        split, current = self._split(epoch, phases), phases[-1]
        skip = current.u
        stream = self._rows(split, skip, self.drop.get(epoch))
        for batch in rechunk(stream, self.batch_size):
            current.u = int(batch[POS][-1]) + 1  # rows a rollback dropped count as read
            yield batch, [Phase(**p.to_dict()) for p in phases]

    def _rows(self, split: Split, skip: int, drop: np.ndarray | None = None) -> Iterator[dict[str, np.ndarray]]:
        """This rank's rows of the phase after the first ``skip``, window by window, pieces' ends kept (a batch
        never spans two pieces: pieces are whole batches, but for the short last one), less the rows in ``drop``;
        each window with its rows' ids (ROW) and positions in the phase (POS)."""
        base = 0  # the phase position of the piece's first row
        for piece, key in split.pieces(self.rank):
            length = piece.length(None)
            if skip >= length:
                skip -= length
                base += length
                continue
            windows = list(split.order(piece, key, length))
            for i, (lo, (rows, perm)) in enumerate(windows):
                size = min(self.window, length - lo)
                if skip >= lo + size:
                    continue
                if i + 1 < len(windows):
                    self.source.warm(windows[i + 1][1][0], self.prefetch)
                data = self.source.take(rows, self.columns)
                ids = rows.indices(np.arange(size))
                if perm is not None:
                    data = {k: v[perm] for k, v in data.items()}
                    ids = ids[perm]
                data = {**data, ROW: ids, POS: base + lo + np.arange(size)}
                off = max(skip - lo, 0)
                data = _take(data, off, size) if off else data
                if drop is not None:
                    keep = ~np.isin(data[ROW], drop)
                    if not keep.all():
                        data = {k: np.asarray(v)[keep] for k, v in data.items()}
                yield data
            skip = 0
            base += length

    def _produce(self, stop_epoch: int | None) -> Iterator[tuple[Any, int, int, list, list]]:
        """(torch batch, epoch, global rows consumed, phases, the batch's row ids) for every batch this rank gets
        from the position on, up to the start of ``stop_epoch`` (None: no end)."""
        epoch, phases = self.position.epoch, self.position.phases
        if not phases and self.position.rows:  # a position saved before phases existed: one phase, these ranks
            phases = [Phase(self.size, self.batch_size, piece_rows(self.source.first_block_rows(), self.batch_size),
                            self.position.rows // self.size)]
        while stop_epoch is None or epoch < stop_epoch:
            got = False
            for part, now in self._epoch_batches(epoch, phases):
                got = True
                rows = sum(p.n * p.u for p in now)
                ids = part.pop(ROW).tolist()
                part.pop(POS)
                yield self._to_torch(part), epoch, rows, now, ids
            if not got and phases and stop_epoch is not None:
                stop_epoch += 1  # restored at an epoch's very end: that epoch does not count as this loop's pass
            epoch, phases = epoch + 1, []
            yield None, epoch, 0, [], []  # the epoch ended: the position moves on even if the last round was dropped

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
        """One pass: from the position to the end of ``epochs`` epochs (the rest of the epoch the position is
        in, then ``epochs - 1`` more); ``epochs=None``: no end. The next ``for`` goes on from there."""
        stop_epoch = None if self.epochs is None else self.position.epoch + self.epochs
        items = self._prefetched(stop_epoch) if self.prefetch > 0 else self._produce(stop_epoch)
        while True:
            started = time.perf_counter()
            heartbeat.STATE.enter("data")
            item = next(items, _END)
            self.wait_s += time.perf_counter() - started
            if item is _END:
                return
            batch, epoch, consumed, phases, ids = item
            self.position.epoch, self.position.rows, self.position.phases = epoch, consumed, phases
            if batch is not None:
                self.batches += 1
                self.last_rows = ids
                if self.on_batch is not None:
                    self.on_batch(epoch, ids)
                yield batch

    def _prefetched(self, stop_epoch: int | None) -> Iterator[tuple[Any, int, int, list, list]]:
        """``_produce`` run ``prefetch`` items ahead in a daemon thread; its errors are raised here."""
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def run() -> None:
            try:
                for item in self._produce(stop_epoch):
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
