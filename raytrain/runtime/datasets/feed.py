"""One Ray Data execution per ``--data`` dataset, its blocks cached in one fixed order, each worker fetching
only the blocks of its own share.

The driver starts a ``Feeder`` actor (0 CPUs) per dataset: it runs the dataset's Ray Data plan (read + the
job's ``preprocess``) once, streaming, with ``preserve_order=True``, and keeps the output blocks' object refs
in the order Ray Data produced them, with their row counts. Workers (``FeedSource``) get that table as it grows
and fetch only the blocks holding the rows raytrain.runtime.datasets.batches assigns them, as soon as they exist:
training starts when the first blocks are ready, while Ray Data tasks keep producing the rest on the
cluster's CPUs. The second and later epochs, and the workers of a restarted attempt, read the cached blocks
(preprocessing runs once per job, never on a worker, never once per rank). Every worker sees the same block
table in the same order, which is what raytrain.runtime.datasets.batches's disjoint, exactly-once, resumable shards
need. A feed that produces nothing new for ``--data-timeout`` seconds ends with an error naming the pending
Ray Data tasks (``watch_stall``), so neither the driver nor a worker waits forever.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

_POLL_S = 30.0  # how long one blocks() call waits for new blocks before the worker asks again
# A call to the Feeder answers within _POLL_S; the rest is slack for a busy node. Past it the feed is taken
# for gone (a worker never waits on a feed that cannot answer).
CALL_TIMEOUT_S = _POLL_S + 90.0
FETCH_TIMEOUT_S = 300.0  # one block: a lost one is rebuilt from its lineage by Ray (the read re-runs)


class Feed:
    """The Feeder actor's state (plain Python, so it can be tested without an actor)."""

    def __init__(self, where: str, stall_s: float = 0.0):
        self.where = where
        self.stall_s = float(stall_s or 0.0)  # no new block for this long: the feed gives up (0: never)
        self.last_progress = time.monotonic()
        # (block ref, first row, end row or None: to the end, rows)
        self.blocks: list[tuple[Any, int, int | None, int]] = []
        self.rows = 0  # rows produced so far
        self.done = False
        self.error: str | None = None
        self.cond = threading.Condition()

    def add(self, ref: Any, start: int, stop: int | None, rows: int) -> None:
        with self.cond:
            if self.done:  # given up (stalled) already: what comes late changes nothing
                return
            self.blocks.append((ref, start, stop, int(rows)))
            self.rows += rows
            self.last_progress = time.monotonic()
            self.cond.notify_all()

    def finish(self, error: str | None = None) -> None:
        with self.cond:
            if self.done:
                return
            self.done, self.error = True, error
            self.cond.notify_all()

    def stalled_for(self, now: float | None = None) -> float | None:
        """Seconds without a new block when that passed the deadline (None: not stalled, done, or no limit)."""
        with self.cond:
            idle = (time.monotonic() if now is None else now) - self.last_progress
            return idle if not self.done and self.stall_s > 0 and idle > self.stall_s else None

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
    from raytrain.ray_tuning.ray_access import ref_bundles
    from raytrain.runtime.datasets.source import first_line, quiet_ray_data

    quiet_ray_data()
    try:
        for bundle in ref_bundles(dataset):
            for entry, cut in zip(bundle.blocks, bundle.slices):
                if cut is not None:
                    feed.add(entry.ref, cut.start_offset, cut.end_offset, cut.num_rows)
                else:
                    feed.add(entry.ref, 0, None, int(entry.metadata.num_rows or 0))
        feed.finish()
    except Exception as exc:
        feed.finish(f"{feed.where}: reading/preprocessing failed: {first_line(exc)}")


def watch_stall(feed: Feed, describe_pending: Any, poll_s: float = 5.0) -> None:
    """End ``feed`` with a one-line error once it made no progress for its ``stall_s``, naming what Ray Data
    still waits for (``describe_pending()``): nothing waits forever for CPUs another job holds."""
    if feed.stall_s <= 0:
        return
    while not feed.done:
        time.sleep(min(poll_s, max(feed.stall_s / 4, 0.05)))
        idle = feed.stalled_for()
        if idle is not None:
            try:
                pending = describe_pending()
            except Exception as exc:  # the state API is down: still give up, and say what was not known
                pending = f"which Ray Data tasks are pending is unknown (the state API failed: {exc})"
            feed.finish(f"{feed.where}: reading/preprocessing produced no new rows for {idle:.0f} s "
                        f"(--data-timeout {feed.stall_s:g}); {pending}")
            return


def pending_tasks(job_id: str) -> str:
    """The Ray Data tasks of this job still waiting to run, by name, with what each asks for, and the cluster's
    free CPUs: what a stalled feed waits for."""
    import ray
    from ray.util.state import list_tasks

    tasks = list_tasks(filters=[("job_id", "=", job_id)], limit=10_000, timeout=20, detail=True,
                       raise_on_missing_output=False)
    waiting: dict[tuple[str, str], int] = {}
    for task in tasks:
        if str(task.state).startswith("PENDING") and task.type == "NORMAL_TASK":
            asks = ", ".join(f"{k} {v:g}" for k, v in sorted((task.required_resources or {}).items())) or "nothing"
            key = (task.name, asks)
            waiting[key] = waiting.get(key, 0) + 1
    free = ray.available_resources().get("CPU", 0.0)
    total = ray.cluster_resources().get("CPU", 0.0)
    if not waiting:
        return (f"no Ray Data task is pending (Ray Data holds them back, or the source is slow); "
                f"{free:g} of {total:g} CPUs free")
    names = "; ".join(f"{name} x{count} (each asks {asks})" for (name, asks), count in sorted(waiting.items()))
    return f"Ray Data tasks pending: {names}; {free:g} of {total:g} CPUs free (does another job hold them?)"


class Feeder:
    """The actor (see the module doc). Threaded: every worker can wait for blocks at the same time."""

    def __init__(self, dataset: Any, where: str, stall_s: float = 0.0):
        import ray

        self.feed = Feed(where, stall_s)
        threading.Thread(target=run_stream, args=(self.feed, dataset), name="raytrain-feed", daemon=True).start()
        job_id = ray.get_runtime_context().get_job_id()
        threading.Thread(target=watch_stall, args=(self.feed, lambda: pending_tasks(job_id)),
                         name="raytrain-feed-watch", daemon=True).start()

    def since(self, index: int, timeout: float = _POLL_S) -> tuple[list, bool, str | None]:
        return self.feed.since(index, timeout)

    def progress(self, rows: int, timeout: float = _POLL_S) -> tuple[int, bool, str | None]:
        return self.feed.progress(rows, timeout)

    def node(self) -> tuple[str, str]:
        """(node id, IP) of the node this feed runs on."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def actor_name(job_id: str, name: str) -> str:
    return f"raytrain-data-{job_id}-{name}"


NAMESPACE = "raytrain"


def feeder_options(job_id: str, name: str) -> dict:
    """The Feeder actor's Ray options: CPU-less, named for the workers to find, pinned to the driver's node
    (the head: raytrain.runtime.driver.head) with a hard affinity, because Ray puts a CPU-less actor on a
    random node whatever a soft one says, and a lost worker node would take the feed with it."""
    from raytrain.runtime.driver import head

    return {"num_cpus": 0, "max_concurrency": 64, "scheduling_strategy": head.pinned_here(),
            "name": actor_name(job_id, name), "namespace": NAMESPACE}


def start_feeder(dataset: Any, name: str, where: str, stall_s: float = 0.0) -> Any:
    """A Feeder actor for one dataset of this Ray job (``feeder_options``). Placement failures surface on the
    first call to it (the driver's wait for the first rows), as an error naming the data feed."""
    import ray

    options = feeder_options(ray.get_runtime_context().get_job_id(), name)
    return ray.remote(Feeder).options(**options).remote(dataset, where, stall_s)


class BlockSource:
    """The dataset's blocks by global row, as a worker sees them: a table (ref, first row, end row, rows) that
    grows as the stream produces blocks (``_more``), and ``take(rows)``: the rows of a ``Seq``
    (raytrain.runtime.datasets.batches), fetching only the blocks they lie in. The last blocks fetched are kept (a
    piece's windows read one block many times); ``bytes_read`` counts what was fetched."""

    CACHE = 2  # blocks kept: the one being read and the one before (a window can span two)

    def __init__(self) -> None:
        self.table: list[tuple[Any, int, int | None, int]] = []
        self.starts: list[int] = []  # each block's first global row
        self.rows = 0
        self.done = False
        self.cache: dict[tuple, dict] = {}
        self.bytes_read = 0
        self.blocks_read = 0

    # -- what a subclass provides ----------------------------------------------------------------------
    def _more(self) -> None:
        """Add the blocks produced since the table was last grown (waiting a while for one), or set ``done``."""
        raise NotImplementedError

    def _fetch(self, entry: tuple) -> tuple[dict, int]:
        """One block's rows as {column: numpy array} and the bytes fetched for it."""
        raise NotImplementedError

    def _prefetch(self, entries: list[tuple]) -> None:
        """Start moving these blocks to this node (no wait)."""

    # -- the table -----------------------------------------------------------------------------------
    def _add(self, entries: list) -> None:
        for entry in entries:
            self.table.append(tuple(entry))
            self.starts.append(self.rows)
            self.rows += int(entry[3])

    def rows_at_least(self, rows: int) -> int:
        """Rows known once at least ``rows`` exist or the stream ended (then fewer)."""
        while self.rows < rows and not self.done:
            self._more()
        return self.rows

    def total(self) -> int:
        """The dataset's rows (waits for the end of the stream)."""
        while not self.done:
            self._more()
        return self.rows

    def first_block_rows(self) -> int:
        self.rows_at_least(1)
        return max(int(self.table[0][3]), 1) if self.table else 1

    def _blocks_of(self, seq: Any) -> list[int]:
        import bisect

        out: list[int] = []
        for seg in seq.segments:
            if isinstance(seg, np.ndarray):
                if len(seg):
                    out += sorted(set((np.searchsorted(self.starts, seg, side="right") - 1).tolist()))
            else:
                first = bisect.bisect_right(self.starts, seg[0]) - 1
                last = bisect.bisect_right(self.starts, seg[1] - 1) - 1
                out += range(first, last + 1)
        return out

    def _block(self, i: int, columns: list[str] | None) -> dict:
        key = (i, tuple(columns) if columns else None)
        if key in self.cache:
            self.cache[key] = self.cache.pop(key)  # most recent last
            return self.cache[key]
        data, size = self._fetch(self.table[i])
        self.bytes_read += int(size)
        self.blocks_read += 1
        if columns:
            missing = [c for c in columns if c not in data]
            if missing:
                raise KeyError(f"ctx.dataset: column(s) {', '.join(missing)} not in the dataset "
                               f"(it has {', '.join(data)})")
            data = {c: data[c] for c in columns}
        self.cache[key] = data
        while len(self.cache) > self.CACHE:
            self.cache.pop(next(iter(self.cache)))
        return data

    def take(self, seq: Any, columns: list[str] | None = None) -> dict:
        """The rows of ``seq`` (a closed raytrain.runtime.datasets.batches.Seq), in its order, as {column: numpy array}."""
        parts: list[dict] = []
        for seg in seq.segments:
            if isinstance(seg, np.ndarray):
                if not len(seg):
                    continue
                self.rows_at_least(int(seg.max()) + 1)
                which = np.searchsorted(self.starts, seg, side="right") - 1
                pieces, where = [], []
                for b in sorted(set(which.tolist())):
                    mask = which == b
                    data = self._block(b, columns)
                    pieces.append({k: v[seg[mask] - self.starts[b]] for k, v in data.items()})
                    where.append(np.flatnonzero(mask))
                joined = _concat(pieces)
                order = np.argsort(np.concatenate(where), kind="stable")
                parts.append({k: v[order] for k, v in joined.items()})
            else:
                start, stop = seg
                self.rows_at_least(stop)
                for b in self._blocks_of(type(seq)([seg])):
                    lo = self.starts[b]
                    data = self._block(b, columns)
                    a, z = max(start - lo, 0), min(stop - lo, int(self.table[b][3]))
                    parts.append({k: v[a:z] for k, v in data.items()})
        return _concat(parts)

    def warm(self, seq: Any, limit: int) -> None:
        """Start fetching the blocks ``seq`` needs that are not here yet (at most ``limit``)."""
        if limit <= 0:
            return
        todo = [i for i in self._blocks_of(seq) if i < len(self.table) and not any(k[0] == i for k in self.cache)]
        if todo:
            self._prefetch([self.table[i] for i in todo[:limit]])


def _concat(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return {}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class FeedSource(BlockSource):
    """A worker's view of one Feeder (see BlockSource): the block table from the feeder, the blocks from the
    object store, so a worker moves only the blocks of its own share to its node."""

    def __init__(self, name: str, handle: Any = None):
        import ray

        super().__init__()
        self.name = name
        try:
            self.handle = handle or ray.get_actor(actor_name(ray.get_runtime_context().get_job_id(), name),
                                                  namespace=NAMESPACE)
        except ValueError as exc:  # no such actor (any more): it died, or the driver never started it
            raise self._gone(exc) from None  # the driver reports a failure's root cause: this line

    def _more(self) -> None:
        import ray

        try:
            blocks, done, error = ray.get(self.handle.since.remote(len(self.table)), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise self._gone(exc) from None  # the driver reports a failure's root cause: this line
        if error:
            from raytrain.runtime.datasets.source import DataError

            raise DataError(error)
        self._add(blocks)  # with done, these are all the rest: since() copies them after the end was set
        self.done = done

    def _gone(self, exc: BaseException) -> Exception:
        """The error a worker raises when its data feed cannot answer: it names the feed, not Ray's actor."""
        import ray

        from raytrain.runtime.datasets.source import DataError, first_line

        if isinstance(exc, ray.exceptions.GetTimeoutError):
            why = f"it did not answer within {CALL_TIMEOUT_S:.0f} s"
        elif isinstance(exc, ValueError):
            why = f"no actor {actor_name(ray.get_runtime_context().get_job_id(), self.name)} is alive"
        else:
            why = f"it died: {first_line(exc)}"
        return DataError(f"ctx.dataset({self.name!r}): the data feed (the job's Feeder actor on the driver's "
                         f"node) is gone, {why}; the dataset's blocks went with it, so the job cannot continue "
                         f"its epoch (resubmit with --resume to continue from the last checkpoint)")

    def _fetch(self, entry: tuple) -> tuple[dict, int]:
        import ray
        from ray.data.block import BlockAccessor

        ref, start, stop, _ = entry
        try:
            block = ray.get(ref, timeout=FETCH_TIMEOUT_S)
        except ray.exceptions.OwnerDiedError as exc:  # the Feeder owns every block: it is gone
            raise self._gone(exc) from None  # the driver reports a failure's root cause: this line
        except (ray.exceptions.ObjectLostError, ray.exceptions.GetTimeoutError) as exc:
            from raytrain.runtime.datasets.source import DataError, first_line

            raise DataError(f"ctx.dataset({self.name!r}): a block of the dataset could not be fetched or rebuilt "
                            f"within {FETCH_TIMEOUT_S:.0f} s: {first_line(exc)}") from None
        size = BlockAccessor.for_block(block).size_bytes()
        return to_numpy(block, start, stop), size

    def _prefetch(self, entries: list[tuple]) -> None:
        import ray

        refs = [e[0] for e in entries]
        ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)


def to_numpy(block: Any, start: int, stop: int | None) -> dict:
    """One Ray Data block (Arrow or pandas) rows [start, stop) as {column: numpy array}, as iter_batches
    would give it."""
    from ray.data.block import BlockAccessor

    acc = BlockAccessor.for_block(block)
    if start or stop is not None:
        acc = BlockAccessor.for_block(acc.slice(start, acc.num_rows() if stop is None else stop, copy=False))
    return acc.to_batch_format("numpy")
