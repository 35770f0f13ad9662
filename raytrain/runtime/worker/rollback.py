"""Rollbacks (``--rollback-after K``, ``--max-rollbacks N``): after K bad steps in a row (runtime.worker.guard) every
rank raises :class:`Rollback`; Ray Train restarts the worker group from the last checkpoint, and the new workers
drop the bad steps' rows where ``ctx.dataset`` comes to them again (runtime.datasets.batches: the position makes that exact).

- The rows go through the job's board (runtime.driver.hang_watch: a named actor that outlives the worker groups):
  rank 0 notes them there before any rank raises (all ranks wait for it in a barrier), and every new worker
  reads them. They are also saved with every later checkpoint (``ctx.state``), so a restart from one keeps them.
- A rollback is not charged to ``--max-failures``: raytrain's failure policy (installed in the driver around
  ``fit()``) retries a worker group that failed with ``Rollback`` and raises one that failed with
  :class:`RollbackLimit` (the workers raise it instead of rolling back more than ``--max-rollbacks`` times);
  every other failure is Ray Train's default policy's.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

CALL_TIMEOUT_S = 10.0


class Rollback(RuntimeError):
    """Every rank: back to the last checkpoint, the bad steps' rows skipped (the driver's policy retries)."""


class RollbackLimit(RuntimeError):
    """Bad steps in a row again after ``--max-rollbacks`` rollbacks: the job fails with this reason."""


def _board() -> Any:
    import ray

    from raytrain.runtime.driver import hang_watch

    try:
        return ray.get_actor(hang_watch.board_name(ray.get_runtime_context().get_job_id()),
                             namespace=hang_watch.NAMESPACE)
    except Exception:  # noqa: BLE001 (no board: no rollback, see ledger/note)
        return None


def ledger() -> list[dict] | None:
    """The job's rollbacks so far (each: step, message, rows {dataset: {epoch: ids}}); None: no board."""
    import ray

    board = _board()
    if board is None:
        return None
    try:
        return list(ray.get(board.rollback_log.remote(), timeout=CALL_TIMEOUT_S))
    except Exception:  # noqa: BLE001
        return None


def note(entry: dict) -> bool:
    """Keep a rollback's record on the board (rank 0); False when the board cannot be reached."""
    import ray

    board = _board()
    if board is None:
        return False
    try:
        ray.get(board.note_rollback.remote(entry), timeout=CALL_TIMEOUT_S)
        return True
    except Exception:  # noqa: BLE001
        return False


def merge_rows(into: dict[str, dict[str, list[int]]], rows: dict[str, dict[str, list[int]]]) -> None:
    """``into`` ({dataset: {epoch: sorted ids}}) with ``rows`` added."""
    for name, epochs in (rows or {}).items():
        for epoch, ids in epochs.items():
            have = into.setdefault(name, {}).setdefault(str(epoch), [])
            have[:] = sorted(set(have) | {int(i) for i in ids})


def kind_of(exc: BaseException) -> str | None:
    """"Rollback" or "RollbackLimit" when ``exc`` (or what it wraps: Ray's errors keep the worker's) is one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        if name in ("Rollback", "RollbackLimit"):
            return name
        text = str(exc)  # a RayTaskError's text names the worker's exception type
        for kind in ("RollbackLimit", "Rollback"):
            if f"{__name__}.{kind}" in text or f"\n{kind}: " in text or text.startswith(f"{kind}: "):
                return kind
        nxt = getattr(exc, "cause", None) or exc.__cause__
        exc = nxt if isinstance(nxt, BaseException) else None
    return None


def group_kind(error: BaseException) -> str | None:
    """A worker group's failure: "Rollback" when every failed worker rolled back, "RollbackLimit" when any
    reached the limit, else None (an ordinary failure)."""
    failures = getattr(error, "worker_failures", None)
    if not failures:
        return None
    kinds = {kind_of(exc) for exc in failures.values()}
    if "RollbackLimit" in kinds:
        return "RollbackLimit"
    return "Rollback" if kinds == {"Rollback"} else None


def failure_policy(max_rollbacks: int):
    """A failure policy factory for Ray Train (raytrain.ray_tuning.ray_access.failure_policy): its default
    policy, but a rollback is retried without counting toward ``max_failures`` (at most ``max_rollbacks``
    times) and a RollbackLimit is raised."""

    def create(failure_config: Any, default_policy: Any, decision: Any) -> Any:
        class RollbackPolicy(default_policy):
            rollbacks = 0

            def make_decision(self, training_failed_error: Any) -> Any:
                kind = group_kind(training_failed_error)
                if kind == "Rollback" and self.rollbacks < max_rollbacks:
                    self.rollbacks += 1
                    return decision.RETRY
                if kind is not None:
                    return decision.RAISE
                return super().make_decision(training_failed_error)

        return RollbackPolicy(failure_config)

    return create


@contextlib.contextmanager
def installed(max_rollbacks: int) -> Iterator[None]:
    """Ray Train's trainers create their failure policy with ours inside the block (the driver's ``fit()``);
    on a Ray without that factory a rollback counts as a failure toward --max-failures, and the driver says so."""
    from raytrain.ray_tuning.ray_access import failure_policy as ray_failure_policy

    with ray_failure_policy(failure_policy(max_rollbacks)) as ours:
        if not ours:
            print("raytrain: this Ray's Train has no failure-policy factory: a rollback counts toward "
                  "--max-failures", file=sys.stderr, flush=True)
        yield
