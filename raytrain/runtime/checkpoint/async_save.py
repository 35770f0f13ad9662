"""``--checkpoint-mode async``: a save costs the training step only a snapshot of the engine's state in host
memory; the files are written and uploaded on a background thread while training goes on.

How: DeepSpeed writes every tensor file of ``engine.save_checkpoint`` through ``engine.checkpoint_engine.save``
(model states, ZeRO optimizer shards, pipeline layer files, the scheduler and client state inside them). For
the call, :class:`DeferringEngine` stands in for it: each ``save`` copies the state dict's tensors to host memory
(pinned buffers, reused from save to save, on CUDA) and queues the write. The files then are byte for byte
what DeepSpeed would have written (its own checkpoint engine writes them, later), so resume, resharding and
``export`` read them as any other checkpoint. Saving into a local directory and moving that in the
background would have cost the step the serialisation and the write of every byte; a host copy is a memcpy.

Ray Train is told on the training thread (``ray.train.report`` is a collective across ranks: the checkpoint's
folder name is agreed there), with ``checkpoint_upload_mode=ASYNC`` and an upload function that Ray runs on its
upload thread: it writes the queued files and the rank's marker, then copies the folder to the run's storage.
Ray registers the checkpoint only once every rank's report arrived, that is once every rank's files are in
storage; the markers make the same rule readable on storage (raytrain.checkpoints.store: committed = every
rank's marker there and every file it lists at its size). A worker that dies mid-upload leaves an uncommitted
folder that no restart, ``--resume``, ``jobs checkpoints`` or ``export`` uses.

At most one save is in flight per rank: the next one waits for it (and says how long); the end of the job
waits for the last one (and says so).
"""
from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker

# Test hooks: called as hook(step, rank) on the upload thread before a snapshot's files are written (the tests
# hold an upload there to kill a worker while it is in flight). Empty in production.
BEFORE_WRITE: list[Callable[[int, int], None]] = []

REGISTER_TIMEOUT_S = 30.0
# How long rank 0 waits for the other ranks' files of a checkpoint whose own files are uploaded (they upload in
# parallel with it; one that died mid-upload never arrives, and its group is then restarting)
COMMIT_TIMEOUT_S = 600.0  # Ray Train's controller takes a report within a poll (raytrain.ray_tuning.prompt_poll)


_TENSOR: list = []  # torch.Tensor, once imported (host_copy asks of every value: no import per call)


def _is_tensor(obj: Any) -> bool:
    if not _TENSOR:
        import torch

        _TENSOR.append(torch.Tensor)
    return isinstance(obj, _TENSOR[0])


class PinnedPool:
    """Host buffers for the snapshot's tensors (pinned on CUDA), kept between saves: allocating memory costs far
    more than filling it. A buffer is reused only once the previous save's write finished (one save in
    flight). ``buffer`` hands out a tensor's buffer and queues its copy; ``flush`` makes every queued copy in one
    call (``torch._foreach_copy_``: a Python call per tensor costs more than a small tensor's memcpy)."""

    def __init__(self, pin: bool):
        self.pin = pin
        self._buffers: dict[tuple, Any] = {}
        self._dst: list[Any] = []
        self._src: list[Any] = []
        self.copied = 0  # bytes queued since the last reset_count

    def buffer(self, tensor: Any, key: tuple) -> Any:
        import torch

        buf = self._buffers.get(key)
        # reused from save to save: fresh host memory costs a page fault per page on every save
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            pin = self.pin and tensor.device.type == "cuda"
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        self._dst.append(buf)
        self._src.append(tensor)
        self.copied += buf.numel() * buf.element_size()
        return buf

    def flush(self) -> None:
        import torch

        dst, src, self._dst, self._src = self._dst, self._src, [], []
        if not dst:
            return
        with torch.no_grad():
            if hasattr(torch, "_foreach_copy_"):
                torch._foreach_copy_(dst, src, non_blocking=self.pin)
            else:
                for d, t in zip(dst, src):
                    d.copy_(t, non_blocking=self.pin)

    def copy(self, tensor: Any, key: tuple) -> Any:
        """One tensor's host copy, made now."""
        buf = self.buffer(tensor, key)
        self.flush()
        return buf

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def host_copy(obj: Any, pool: PinnedPool, prefix: tuple = (), memo: dict | None = None) -> Any:
    """``obj`` with every tensor copied to host memory (a tensor met twice is copied once); containers are
    rebuilt, other values deep-copied (the live optimizer and scheduler go on changing theirs)."""
    out = _host_structure(obj, pool, prefix, {} if memo is None else memo)
    pool.flush()
    return out


def _host_structure(obj: Any, pool: PinnedPool, prefix: tuple, memo: dict) -> Any:
    """host_copy's walk: the copy's structure, each tensor's copy queued in ``pool``."""
    import copy

    if id(obj) in memo:
        return memo[id(obj)]
    if _is_tensor(obj):
        out = pool.buffer(obj, prefix)
    elif isinstance(obj, dict):
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        for k, v in obj.items():
            out[k] = _host_structure(v, pool, prefix + (k,), memo)
    elif isinstance(obj, (list, tuple)):
        if obj and all(type(v) in _ATOMS for v in obj):  # a list of numbers or names (a param group's "params")
            items = list(obj)
        else:
            items = [_host_structure(v, pool, prefix + (i,), memo) for i, v in enumerate(obj)]
        if isinstance(obj, list):
            out = items
        elif hasattr(obj, "_fields"):  # a namedtuple
            out = type(obj)(*items)
        else:
            try:
                out = type(obj)(items)
            except TypeError:
                out = tuple(items)
    elif type(obj) in _ATOMS:
        out = obj
    else:
        try:
            out = copy.deepcopy(obj)
        except Exception:  # an object that cannot be copied is saved as it is when written
            out = obj
    memo[id(obj)] = out
    return out


_ATOMS = (int, float, str, bool, bytes, type(None))


class DeferringEngine:
    """Stands in for DeepSpeed's checkpoint engine during one ``save_checkpoint``: ``save`` takes a host copy
    and queues the write; everything else is the real engine's."""

    def __init__(self, inner: Any, pool: PinnedPool):
        self.inner = inner
        self.pool = pool
        self.writes: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        self.writes.append((path, host_copy(state_dict, self.pool, (Path(path).name,))))

    def preserves_storage_sharing(self) -> bool:
        # the host copy already gives each tensor its own storage: DeepSpeed need not clone first
        return False


@dataclass
class Snapshot:
    """One rank's checkpoint in host memory, and what its marker will say."""

    directory: Path
    writes: list[tuple[str, Any]]
    writer: Any  # DeepSpeed's own checkpoint engine: writes each file as a synchronous save would
    marker: Marker
    ready: Any = None  # a CUDA event: the device-to-host copies are done
    snapshot_s: float = 0.0
    nbytes: int = 0

    def write(self, into: Path | None = None) -> None:
        """Write the files, then the marker (last: it lists every file with its size). ``into``: a folder to
        write them to instead of :attr:`directory` (the checkpoint's folder in a filesystem storage, which the
        other ranks write their files into at the same time: the marker lists this rank's files only)."""
        import shutil
        from dataclasses import replace

        if self.ready is not None:
            self.ready.synchronize()
        target = self.directory if into is None else Path(into)
        mine = [p.relative_to(self.directory) for p in self.directory.rglob("*") if p.is_file()]
        for rel in mine:  # what was written at the snapshot (DeepSpeed's `latest`, rank 0's HF config...)
            if target != self.directory:
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.directory / rel, target / rel)
        for path, state in self.writes:
            rel = Path(path).relative_to(self.directory)
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            self.writer.save(state, str(target / rel))
            mine.append(rel)
        self.writes = []
        files = {str(rel): (target / rel).stat().st_size for rel in mine}
        markers.write(target, replace(self.marker, files=files))


def snapshot(
    engine: Any, pool: PinnedPool, *, rank: int, world_size: int, step: int, user_state: dict, metrics: dict,
    hf_model: dict | None = None,
) -> Snapshot:
    """This rank's part of a checkpoint, as :func:`raytrain.runtime.checkpoint.files.save` writes it, with the tensor
    files held in host memory until :meth:`Snapshot.write`. Every rank calls it (DeepSpeed's save has barriers)."""
    import json

    import torch

    from raytrain.runtime.checkpoint import files as checkpoint

    started = time.perf_counter()
    pool.copied = 0
    directory = Path(tempfile.mkdtemp(prefix=f"raytrain-ckpt-{rank}-"))
    tag = f"step{step}"
    real = engine.checkpoint_engine
    deferring = DeferringEngine(real, pool)
    engine.checkpoint_engine = deferring
    try:
        engine.save_checkpoint(str(directory), tag=tag, client_state={"raytrain_step": step})
    finally:
        engine.checkpoint_engine = real
    state = {"rng": checkpoint._rng_state(), "user_state": user_state, "step": step}
    deferring.writes.append((str(directory / checkpoint.STATE_FILE.format(rank=rank)),
                             host_copy(state, pool, (checkpoint.STATE_FILE,))))
    if hf_model is not None and rank == 0:
        (directory / markers.HF_FILE).write_text(json.dumps(hf_model, indent=1, sort_keys=True))
    if hf_model is not None and hf_model.get("adapter"):  # small files, and a gather under ZeRO-3: written now
        from raytrain.runtime.hf.model import save_adapter

        save_adapter(engine.module, directory, rank=rank)
    ready = None
    if pool.pin and torch.cuda.is_available():
        ready = torch.cuda.Event()
        ready.record()
    snap = Snapshot(
        directory=directory, writes=deferring.writes, writer=real, ready=ready,
        marker=Marker(rank=rank, world_size=world_size, step=step, tag=tag, time=time.time(), metrics=metrics),
    )
    snap.nbytes = pool.copied
    snap.snapshot_s = time.perf_counter() - started
    return snap


@dataclass
class InFlight:
    """One rank's save after its snapshot: written and uploaded by Ray's upload thread, then registered."""

    step: int
    snapshot_s: float
    nbytes: int
    started: float = field(default_factory=time.perf_counter)
    write_s: float | None = None
    upload_s: float | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    registered: bool = False
    path: str | None = None  # the checkpoint's folder in storage, where storage is a local/shared filesystem
    wait_s: float = 0.0  # what its snapshot waited for the save before it


class AsyncSaver:
    """The async saves of one rank: at most one in flight."""

    def __init__(self, *, rank: int, emit: Callable[..., None], log: Callable[[str], None],
                 register: Callable[[float], bool]):
        """``emit``: rank 0's checkpoint event; ``register``: waits until Ray Train's controller has this
        worker's last report (raytrain.runtime.checkpoint.lifecycle.wait_until_registered)."""
        import torch

        self.rank = rank
        self.pool = PinnedPool(pin=torch.cuda.is_available())
        self.current: InFlight | None = None
        self._emit, self._log, self._register = emit, log, register

    def wait(self, timeout_s: float | None = None) -> float:
        """Until the save in flight (if any) is committed on this rank; returns the seconds waited. Raises the
        save's error. ``timeout_s`` None: as long as the upload takes (Ray's upload thread reports a failed
        upload to the training thread, and the error ends the wait)."""
        current = self.current
        if current is None:
            return 0.0
        started = time.perf_counter()
        deadline = None if timeout_s is None else started + timeout_s
        while not current.done.wait(0.5):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"raytrain: the checkpoint of step {current.step} did not finish uploading "
                                   f"within {timeout_s:g} s")
        self.current = None
        if current.error is not None:
            raise RuntimeError(f"raytrain: the checkpoint of step {current.step} failed: {current.error}") \
                from current.error
        return time.perf_counter() - started

    def save(self, engine: Any, *, world_size: int, step: int, user_state: dict, metrics: dict,
             hf_model: dict | None) -> dict:
        """Snapshot on the training thread, then hand it to Ray Train's upload thread. Returns the timings."""
        import ray.train
        from ray.train import CheckpointUploadMode

        waited_for = self.current.step if self.current is not None else None
        wait_s = self.wait()
        if waited_for is not None and wait_s >= 0.01:
            self._log(f"raytrain: rank {self.rank}: the checkpoint of step {step} waited {wait_s:.2f} s for step "
                      f"{waited_for}'s save to finish (one save in flight per rank)")
        snap = snapshot(engine, self.pool, rank=self.rank, world_size=world_size, step=step, user_state=user_state,
                        metrics=metrics, hf_model=hf_model)
        flight = InFlight(step=step, snapshot_s=snap.snapshot_s, nbytes=snap.nbytes, wait_s=wait_s)

        def upload(checkpoint: Any, dir_name: str) -> Any:
            try:
                _lower_priority()
                for hook in BEFORE_WRITE:
                    hook(step, self.rank)
                from ray.train import Checkpoint, get_context

                storage = get_context().get_storage()
                t0 = time.perf_counter()
                if type(storage.storage_filesystem).__name__ == "LocalFileSystem":
                    # a filesystem storage (a local or shared path): the files are written there directly,
                    # once, rather than written here and copied
                    target = storage.build_checkpoint_path_from_name(dir_name)
                    snap.write(into=Path(target))
                    flight.write_s, flight.upload_s = time.perf_counter() - t0, 0.0
                    flight.path = target
                    return Checkpoint(target, storage.storage_filesystem)
                snap.write()
                t1 = time.perf_counter()
                flight.write_s = t1 - t0
                persisted = storage.persist_current_checkpoint(checkpoint, dir_name)
                flight.upload_s = time.perf_counter() - t1
                return persisted
            except BaseException as exc:
                flight.error = exc
                flight.done.set()
                raise

        ray.train.report(
            metrics, checkpoint=ray.train.Checkpoint.from_directory(str(snap.directory)),
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC, checkpoint_upload_fn=upload,
            delete_local_checkpoint_after_upload=True,
        )
        index = _report_index()
        self.current = flight
        threading.Thread(target=self._commit, args=(flight, index), name=f"raytrain-ckpt-{step}", daemon=True).start()
        return {"snapshot_s": round(snap.snapshot_s, 4), "wait_s": round(wait_s, 4)}

    def _commit(self, flight: InFlight, index: int | None) -> None:
        """Ray's upload thread has written and uploaded the files and queued the report: wait until the
        controller has it, then the save is done."""
        try:
            while not flight.done.is_set() and not _reported(index):
                time.sleep(0.01)
            if flight.error is None:
                flight.registered = self._register(REGISTER_TIMEOUT_S)
                if self.rank == 0 and self._committed(flight):
                    self._emit(step=flight.step, mode="async", snapshot_s=round(flight.snapshot_s, 4),
                               write_s=_round(flight.write_s), upload_s=_round(flight.upload_s),
                               wait_s=round(flight.wait_s, 4), bytes=flight.nbytes)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            flight.error = flight.error or exc
        finally:
            flight.done.set()


    def _committed(self, flight: InFlight) -> bool:
        """Rank 0, before it announces a checkpoint: every rank's files are in storage (their markers and every
        file they list; raytrain.checkpoints.store). The other ranks upload at the same time; one that died
        mid-upload never completes it, and its group is being restarted: no announcement then. Storage that is
        not a filesystem here (s3://, gs://): Ray Train's registration, which needs every rank's report."""
        if flight.path is None:
            return True
        from raytrain.checkpoints import store

        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while True:
            info = store.inspect(flight.path)
            if info.complete:
                return True
            if time.monotonic() > deadline:
                self._log(f"raytrain: the checkpoint of step {flight.step} is not committed after "
                          f"{COMMIT_TIMEOUT_S:g} s ({info.reason}): not announced, and never resumed from")
                return False
            time.sleep(0.05)


def _lower_priority() -> None:
    """The writing thread yields the CPU to the training thread (Linux: a thread has its own nice value); it
    only ever writes checkpoints."""
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _report_index() -> int | None:
    """The index of the report just made (Ray Train v2's train context), or None on another version."""
    from raytrain.ray_tuning.ray_access import report_indices

    indices = report_indices()
    return None if indices is None else indices[0]


def _reported(index: int | None) -> bool:
    """Ray's upload thread put report ``index`` on the worker's result queue (after its upload)."""
    if index is None:
        return True
    from raytrain.ray_tuning.ray_access import report_indices

    indices = report_indices()
    return True if indices is None else indices[1] >= index
