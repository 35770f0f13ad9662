"""Preemption-aware checkpoints: a notice that this worker is about to lose its node (a SIGTERM to the worker
process, a Ray drain of its node with its deadline, or the notice file a Kubernetes preStop hook writes)
becomes, at the next step boundary, one decision of all ranks (a single all-reduce in ``ctx.report``): every
rank saves the same step through the checkpointer's ordinary save, the rank that got the notice records why
(a ``preempted`` event, with the save time), then every rank raises ``Preempted`` and Ray Train restarts the
group from that checkpoint (the restart counts toward ``--max-failures``). Where the deadline left is shorter
than the last measured save, no checkpoint is started (a partial one helps no one): the event says so and the
group restarts from the last committed checkpoint.

Where the notice comes from, and why off the training thread:
- SIGTERM: Python runs signal handlers only on a process's main thread, and Ray Train runs ``train(ctx)`` on a
  thread of its own; ``install`` runs on each worker actor's main thread (the backend's ``on_start``), and
  replaces Ray's handler (which would exit the process mid-step) by one that only records the notice.
- Ray's drain (``ray drain-node``, the autoscaler, KubeRay): the GCS keeps the draining nodes and their
  deadlines; a daemon thread asks for them every ``POLL_S`` (one small GCS call; the training thread never
  waits on it).
- Kubernetes: the generated pods' preStop hook writes ``$RAYTRAIN_PREEMPT_FILE`` and waits for its ``.done`` (written
  here once the checkpoint is committed) or the grace period, whichever comes first.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

POLL_S = 1.0  # how often the watcher thread asks the GCS for draining nodes and looks for the notice file


def notice_file() -> str | None:
    """The file a Kubernetes preStop hook writes (``RAYTRAIN_PREEMPT_FILE``, set in the generated pods), or None.
    Its ``.done`` sibling, written after the preemption checkpoint, lets the hook return early."""
    from raytrain import settings

    return settings.get("RAYTRAIN_PREEMPT_FILE")


class Preempted(RuntimeError):
    """Raised on every rank after a preemption checkpoint (or after deciding not to write one): Ray Train then
    restarts the worker group from the last committed checkpoint."""


@dataclass
class Notice:
    reason: str  # "SIGTERM", "node drain (REASON)", "preStop notice"
    deadline: float | None  # seconds since the epoch by which the node goes away; None: not known
    received: float


_lock = threading.Lock()
_notice: Notice | None = None
_watcher: threading.Thread | None = None
_previous_handler: Any = None


def notify(reason: str, deadline: float | None = None) -> None:
    """Record a notice (the first one wins; a later one may only bring the deadline forward)."""
    global _notice
    with _lock:
        if _notice is None:
            _notice = Notice(reason, deadline, time.time())
        elif deadline is not None and (_notice.deadline is None or deadline < _notice.deadline):
            _notice.deadline = deadline


def current() -> Notice | None:
    return _notice


def reset() -> None:
    """Forget the notice (a test; a process never gets a second chance after a preemption)."""
    global _notice
    with _lock:
        _notice = None


def _on_sigterm(signum: int, frame: Any) -> None:
    if _notice is not None and _notice.reason == "SIGTERM":  # a second SIGTERM: the sender means it
        previous = _previous_handler
        if callable(previous):
            previous(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    notify("SIGTERM")


def install() -> bool:
    """On a worker's main thread (Ray Train's ``worker_group.execute``): take SIGTERM as a preemption notice.
    False where this is not the main thread (the notice then comes from a drain or the notice file only)."""
    global _previous_handler
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not _on_sigterm:
        _previous_handler = previous
        signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def draining_deadline(node_id: str) -> tuple[bool, float | None]:
    """(whether the GCS lists ``node_id`` as draining, its deadline in seconds since the epoch or None)."""
    from raytrain.ray_tuning.ray_access import draining_nodes

    nodes = draining_nodes() or {}
    if node_id not in nodes:
        return False, None
    deadline_ms = int(nodes[node_id] or 0)
    return True, (deadline_ms / 1000.0 if deadline_ms > 0 else None)


def _watch(node_id: str | None, path: str | None, stop: threading.Event) -> None:
    failures = 0
    while not stop.wait(POLL_S):
        if path and os.path.exists(path):
            notify("preStop notice", _deadline_from_file(path))
        if node_id and failures < 10:  # a GCS that keeps failing is not asked forever
            try:
                draining, deadline = draining_deadline(node_id)
            except Exception:  # noqa: BLE001 (a GCS hiccup: ask again at the next poll)
                failures += 1
                continue
            if draining:
                notify("node drain", deadline)


def _deadline_from_file(path: str) -> float | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return float(text) if text else None
    except (OSError, ValueError):
        return None


def start_watch() -> None:
    """On a worker: the daemon thread that turns a node drain or the preStop's notice file into a notice."""
    global _watcher
    if _watcher is not None:
        return
    node_id = None
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 (no Ray: the notice file and SIGTERM still count)
        pass
    _watcher = threading.Thread(target=_watch, args=(node_id, notice_file(), threading.Event()), name="raytrain-preemption",
                                daemon=True)
    _watcher.start()


DRIVER_REASON = "driver SIGTERM"  # the notice the driver's SIGTERM sends every rank (runtime.driver.entrypoint)
# After a driver's notice the ranks wait for the driver to end the job (it does once it heard of the commit);
# bounded, should it never do so
DRIVER_END_WAIT_S = 120.0


def agreed(*, rank: int, device: Any, world_size: int) -> tuple[bool, int, float | None]:
    """At a step boundary, on every rank (one all-reduce): (whether any rank has a notice, the highest rank that
    has one, the earliest deadline among them as seconds left, or None)."""
    return agreed_notice(rank=rank, device=device, world_size=world_size)[:3]


def agreed_notice(*, rank: int, device: Any, world_size: int) -> tuple[bool, int, float | None, bool]:
    """:func:`agreed`, and whether any rank's notice is the driver's SIGTERM (the job then ends after the
    checkpoint instead of restarting)."""
    import torch

    notice = _notice
    left = -math.inf
    if notice is not None and notice.deadline is not None:
        left = -(notice.deadline - time.time())  # MAX of the negation: the least time left
    who = float(rank) if notice is not None else -1.0
    driver = 1.0 if notice is not None and notice.reason == DRIVER_REASON else 0.0
    t = torch.tensor([1.0 if notice is not None else 0.0, who, left, driver], dtype=torch.float64, device=device)
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    flag, who, neg_left, driver = t.tolist()
    return flag > 0, int(who), (None if math.isinf(neg_left) else -neg_left), driver > 0


def describe(notice: Notice | None, *, rank: int, node: str) -> str:
    reason = notice.reason if notice else "a notice on another rank"
    return f"{reason} on rank {rank} (node {node})"


def node_name() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001
        return socket.gethostname()


def mark_done() -> None:
    """Tell a waiting preStop hook that this pod's checkpoint is committed (best effort)."""
    path = notice_file()
    if path and os.path.exists(path):
        try:
            with open(path + ".done", "w") as f:
                f.write(f"{time.time():.3f}\n")
        except OSError:
            pass


def check(ctx: Any, metrics: dict[str, Any]) -> None:
    """At the step boundary ``ctx.report`` reaches, on every rank: with a notice on any rank, every rank saves
    this step (unless it was just saved), the rank that got the notice records why, and every rank raises
    ``Preempted``. Where the deadline left is shorter than the last measured save, nothing is written."""
    from raytrain import events

    noticed, who, left, by_driver = agreed_notice(rank=ctx.rank, device=getattr(ctx.engine, "device", "cpu"),
                                                  world_size=ctx.world_size)
    if not noticed:
        return
    step = int(metrics["step"])
    where = describe(current(), rank=who, node=node_name()) if ctx.rank == who else ""
    last = ctx.last_save_s
    if left is not None and last is not None and left < last:
        message = (f"preempted: {where}: {max(left, 0):.1f} s left before the deadline, shorter than the last "
                   f"save ({last:.1f} s): no checkpoint of step {step} written; the restart resumes from the last "
                   f"committed checkpoint")
        if ctx.rank == who:
            events.emit(events.PREEMPTED, step=step, rank=who, saved=False, deadline_s=round(left, 3),
                        save_s=round(last, 3), time=round(time.time(), 3), message=message)
        _end(ctx, by_driver, who, {"step": step, "saved": False}, message)
    saved = ctx._checkpoints.last_saved_step == step  # a periodic checkpoint of this very step
    save_s = ctx.last_save_s or 0.0
    if not saved:
        ctx._save(dict(metrics))
        save_s = ctx.last_save_s or 0.0
        saved = ctx._checkpoints.last_saved_step == step
    if saved:  # an async save is committed only once every rank's files are uploaded: wait for that here
        save_s += ctx._checkpoints.wait_in_flight()
    mark_done()
    then = "the driver ends the job (--resume continues from it)" if by_driver else "restarting"
    if saved:
        message = f"preempted: {where}: checkpoint of step {step} committed in {save_s:.1f} s; {then}"
    else:
        message = f"preempted: {where}: no checkpoint of step {step} (refused); {then}"
    if ctx.rank == who:
        events.emit(events.PREEMPTED, step=step, rank=who, saved=saved, save_s=round(save_s, 3),
                    **({"deadline_s": round(left, 3)} if left is not None else {}), time=round(time.time(), 3),
                    message=message)
    _end(ctx, by_driver, who, {"step": step, "saved": saved, "save_s": round(save_s, 3)}, message)


def tell_driver(outcome: dict) -> bool:
    """Tell the driver, through the job's board, what its notice led to; False where that fails (the driver then
    ends the job at its own deadline)."""
    try:
        import ray

        from raytrain.runtime.driver import hang_watch

        board = ray.get_actor(hang_watch.board_name(ray.get_runtime_context().get_job_id()),
                              namespace=hang_watch.NAMESPACE)
        ray.get(board.preempted.remote(outcome), timeout=10)
        return True
    except Exception:  # noqa: BLE001
        return False


def _end(ctx: Any, by_driver: bool, who: int, outcome: dict, message: str) -> None:
    """A worker's notice: raise ``Preempted`` (Ray Train restarts the group). The driver's: tell it the outcome
    (rank ``who``) and wait for it to end the job (a restart would only be killed with it), bounded."""
    if by_driver:
        if ctx.rank == who:
            tell_driver(outcome)
        time.sleep(DRIVER_END_WAIT_S)
    raise Preempted(message)
