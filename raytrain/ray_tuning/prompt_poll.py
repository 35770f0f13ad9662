"""Ray Train's controller polls the workers seldom while they train, and at once when one of them needs it.

Ray Train's controller learns everything from the workers by polling them (``poll_status``, one actor task per
worker) every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``: that a checkpoint was reported, that the train function
returned or raised. raytrain used to set the interval to 0.2 s (Ray's default: 2 s) so that a checkpoint
report and the end of a job waited ~0.1 s for the next poll instead of ~1 s. That is five polls a second for
the whole run: the controller's Python wakes and each worker's actor thread takes the GIL from the training
thread, on the cores the workers train on (1 % of a core in the controller alone on a 2-worker CPU job).

Here the controller (:func:`controller_class`, in place of Ray's while ``installed()``) polls every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (Ray's 2 s unless the job sets it), and a worker that is about to need a
poll asks for it (:func:`ask`): after it reported a checkpoint, and when its train function ends (returned or
raised). The controller then polls at once and every ``FAST_S`` (0.05 s) for the next
``WINDOW_S`` (0.5 s: the poll that takes a checkpoint report and the one that confirms it; a
train function that has returned). A worker process that dies without asking is found by the next regular
poll, as under Ray's default. With the tuning off (``RAYTRAIN_RAY_TUNING=off``, or a Ray it was not written
for) Ray's controller runs as Ray has it, polling every 0.2 s (a public knob) unless the job sets the interval.

Imports Ray Train only when called (the CLI never does).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from raytrain import ray_tuning

INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
FAST_S, WINDOW_S = 0.05, 0.5
OFF_INTERVAL_S = "0.2"  # the interval without prompt polls: a checkpoint report waits ~0.1 s for the poll
METHOD = "raytrain_poll_soon"


def enabled(say: bool = True) -> bool:
    return ray_tuning.on("prompt_poll", say=say)


def configure_driver_env() -> None:
    """In the driver, before Ray Train reads its environment (the controller's env is derived from it): without
    prompt polls, poll every 0.2 s unless the job set an interval."""
    if not enabled():
        os.environ.setdefault(INTERVAL_ENV, OFF_INTERVAL_S)


_CLASS: list[type] = []


def controller_class() -> type:
    """Ray Train's TrainController whose wait between polls ends early when a worker asks (``raytrain_poll_soon``)."""
    if _CLASS:
        return _CLASS[0]
    import asyncio

    import ray
    from ray.train.v2._internal.execution.controller import TrainController
    from ray.train.v2._internal.util import time_monotonic

    class PromptPollController(TrainController):
        _raytrain_asked: asyncio.Event | None = None  # made on the actor's event loop, at first use
        _raytrain_fast_until = float("-inf")  # poll every FAST_S until then

        # A copy of TrainController._poll_workers (Ray 2.60) whose sleep is a wait on ``_raytrain_asked``.
        async def _poll_workers(self):
            event = self._raytrain_event()
            while not event.is_set():
                now = time_monotonic()
                interval = self._health_check_interval_s
                if now < self._raytrain_fast_until:
                    interval = min(interval, FAST_S)
                remaining = interval - (now - self._latest_poll_time)
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                    waited_out = False
                except asyncio.TimeoutError:
                    waited_out = True
                if self.get_state().is_terminal():  # as Ray's: stopped while it waited
                    ray.actor.exit_actor()
                if waited_out:
                    break
            event.clear()
            status = self._worker_group.poll_status(timeout=self._health_check_interval_s)
            self._latest_poll_time = time_monotonic()
            return status

        def _raytrain_event(self) -> asyncio.Event:
            if self._raytrain_asked is None:
                self._raytrain_asked = asyncio.Event()
            return self._raytrain_asked

        async def raytrain_poll_soon(self, window_s: float | None = None) -> None:
            """Poll the workers now, then every FAST_S for ``window_s`` seconds."""
            window = WINDOW_S if window_s is None else float(window_s)
            self._raytrain_fast_until = max(self._raytrain_fast_until, time_monotonic() + window)
            self._raytrain_event().set()

    # Ray's name, as Ray Train users know it from logs and process titles ("ray::TrainController.run")
    PromptPollController.__name__ = PromptPollController.__qualname__ = "TrainController"
    _CLASS.append(PromptPollController)
    return PromptPollController


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """While the trainer runs (``fit``), Ray Train creates its controller from :func:`controller_class`."""
    if not enabled():
        yield
        return
    from ray.train.v2.api import data_parallel_trainer

    original = data_parallel_trainer.TrainController
    data_parallel_trainer.TrainController = controller_class()
    try:
        yield
    finally:
        data_parallel_trainer.TrainController = original


def ask(window_s: float | None = None) -> bool:
    """On a worker: ask the controller to poll now (and often for a while). Fire and forget; False where the
    controller is Ray's own or cannot be reached (the next regular poll then comes as usual)."""
    if not enabled(say=False):
        return False
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        controller = get_train_context().controller_actor
        method = getattr(controller, METHOD)
        method.remote(window_s)
    except Exception:
        return False
    return True
