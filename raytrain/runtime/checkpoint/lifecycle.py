"""The checkpoints of one ``train(ctx)`` run on a worker: the point it continues from (its rank-0 marker read
once), resharding that point when the world size changed, restoring it into the engine, when to save
(every ``--checkpoint-every`` steps, when the job asks, and after the last step) and saving through Ray
Train. The files themselves: raytrain.runtime.checkpoint.files; their marker: raytrain.checkpoints.marker."""
from __future__ import annotations

import shutil
import time
from typing import Any, Callable

from raytrain import events
from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker
from raytrain.ray_tuning.report_barrier import wait_until_registered  # noqa: F401 - hf_checkpoints' too
from raytrain.runtime.checkpoint import files as checkpoint


class Checkpointer:
    def __init__(self, *, restore_from: str | None, every: int, rank: int, local_rank: int, world_size: int,
                 mode: str = "sync"):
        self.restore_from = restore_from
        self.every = int(every or 0)
        self.mode = mode  # --checkpoint-mode: "async" (raytrain.runtime.checkpoint.async_save) or "sync"
        self._async = None  # the AsyncSaver, on the first async save
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        # Rank 0's marker of the restore point (None: nothing to restore, or unreadable: the restore then
        # fails with the reason).
        self.saved: Marker | None = markers.read_or_none(restore_from) if restore_from else None
        self.last_saved_step: int | None = None
        self._universal: str | None = None  # a resharded copy of the restore point (see prepare_restore)
        self.hf_model: dict | None = None  # a Hugging Face model's config, class and adapter (runtime.hf.model)
        self.on_commit: Callable[[dict], None] | None = None  # rank 0 with --track: each commit's event

    @property
    def saved_world_size(self) -> int | None:
        return self.saved.world_size if self.saved else None

    def due(self, step: int) -> bool:
        """Whether ``--checkpoint-every`` asks for a save at ``step``."""
        return bool(self.every) and int(step) % self.every == 0

    def prepare_restore(self, config: dict[str, Any], *, tp: int, pp: int, log: Callable[..., None]) -> None:
        """Before the engine is built: a ZeRO restore point saved by another number of workers is converted
        to a DeepSpeed universal checkpoint, and ``config`` told to load it (data parallel only)."""
        self._universal = None
        saved = self.saved
        if not (saved and tp == 1 and pp == 1):
            return
        self._universal = checkpoint.reshard_if_needed(
            config, self.restore_from, saved.tag, saved_world_size=saved.world_size, world_size=self.world_size,
            local_rank=self.local_rank, log=log,
        )

    def restore(self, engine: Any) -> tuple[int, dict[str, Any]] | None:
        """Load the restore point into ``engine``: (step, the job's state), or None without one."""
        if not self.restore_from:
            return None
        step, state = checkpoint.load(
            engine, self.restore_from, rank=self.rank, world_size=self.world_size, universal=self._universal
        )
        self.last_saved_step = step
        return step, state

    def save(self, engine: Any, metrics: dict[str, Any], state: dict[str, Any]) -> None:
        """Every rank saves its shard and reports it to Ray Train with the step's metrics (Ray Train keeps
        the latest for restarts and ``Result.metrics``); rank 0 then emits the checkpoint event."""
        import ray.train

        from raytrain.runtime.worker import heartbeat

        heartbeat.STATE.enter("checkpoint")
        step = int(metrics["step"])
        if self.mode == "async":
            try:
                self._save_async(engine, metrics, state, step)
            finally:
                heartbeat.STATE.enter("data")
            return
        started = time.perf_counter()
        directory = checkpoint.save(
            engine, rank=self.rank, world_size=self.world_size, step=step, user_state=state, metrics=metrics,
            hf_model=self.hf_model,
        )
        try:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        wait_until_registered()
        self.last_saved_step = step
        heartbeat.STATE.enter("data")
        if self.rank == 0:
            self._committed(step=step, mode="sync", stall_s=round(time.perf_counter() - started, 4))

    def _save_async(self, engine: Any, metrics: dict[str, Any], state: dict[str, Any], step: int) -> None:
        from raytrain.runtime.checkpoint.async_save import AsyncSaver

        if self._async is None:
            self._async = AsyncSaver(rank=self.rank, emit=self._committed,
                                     log=lambda line: print(line, flush=True), register=wait_until_registered)
        self._async.save(engine, world_size=self.world_size, step=step, user_state=state, metrics=metrics,
                         hf_model=self.hf_model)
        self.last_saved_step = step

    def _committed(self, **event: Any) -> None:
        events.emit(events.CHECKPOINT, **event)
        if self.on_commit is not None:
            self.on_commit({"event": events.CHECKPOINT, **event})

    def wait_in_flight(self) -> float:
        """Block until the save in flight (async mode) is committed; the seconds waited (0: none in flight)."""
        saver = self._async
        if saver is None or saver.current is None:
            return 0.0
        return saver.wait()

    def finish(self) -> None:
        """The end of the job: wait for the save in flight (async mode) and say so (rank 0, one line)."""
        saver = self._async
        if saver is None or saver.current is None:
            return
        step = saver.current.step
        waited = saver.wait()
        if self.rank == 0:
            print(f"raytrain: the job's end waited {waited:.2f} s for the checkpoint of step {step} to be written "
                  "and uploaded: committed", flush=True)

    def final_save_needed(self, last_metrics: dict[str, Any]) -> bool:
        """After the last step: checkpointing is on and that step has no checkpoint yet."""
        return bool(self.every) and bool(last_metrics) and self.last_saved_step != int(last_metrics["step"])
