"""A worker's checkpoint report returns once Ray Train's controller has it (the ``report_barrier`` tuning).

It reads the worker's result queue from Ray Train's internal train context and counts the controller's polls
of it; off (``RAYTRAIN_RAY_TUNING=off``, or a Ray it was not written for) a report returns as Ray's does.
"""
from __future__ import annotations

from raytrain import ray_tuning


def wait_until_registered(timeout_s: float = 30.0) -> bool:
    """Until Ray Train's controller has this worker's last report. ``ray.train.report`` returns once the
    checkpoint is in storage and its report sits in a one-slot queue; the controller's next poll of the worker
    (asked for here: raytrain.ray_tuning.prompt_poll) takes it and returns it in its reply. A worker that died before
    that reply reached the controller took the checkpoint with it, and the group restarted from the one
    before (Ray's own TODO in poll_status: "only mark the task done when the result has been processed").
    The controller polls a worker again only once its previous poll has answered, so the poll after the one
    that took the report proves the report arrived. A checkpoint report may wait (a metrics report never
    does): True then, False after ``timeout_s`` or where the queue is not found."""
    import time

    if not ray_tuning.on("report_barrier", say=False):
        return False
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        queue = get_train_context().get_result_queue()
    except Exception:  # another Ray Train version: nothing to wait on
        return False
    polls = _polls(queue)
    from raytrain.ray_tuning import prompt_poll

    prompt_poll.ask()  # the controller polls now rather than at its next regular poll
    deadline = time.monotonic() + timeout_s
    while not queue.empty():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    taken_by = polls["n"]
    while polls["n"] == taken_by:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _polls(result_queue) -> dict:
    """Counts the controller's polls of this worker: each one takes from ``result_queue`` with get_nowait."""
    state = getattr(result_queue, "_raytrain_polls", None)
    if state is None:
        state = {"n": 0}
        take = result_queue.get_nowait

        def get_nowait():
            state["n"] += 1
            return take()

        result_queue.get_nowait = get_nowait
        result_queue._raytrain_polls = state
    return state
