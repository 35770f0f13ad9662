"""The driver's view of placement groups (Ray's state API): remove the groups ended jobs leaked before
``fit()``, and watch this job's groups while it runs, so that a job whose workers cannot be placed says what it
waits for and who holds it (``waiting`` / ``placed`` events) and gives up after ``--start-timeout``.

``python -m raytrain.runtime.driver.placement_watch`` removes leaked groups and prints a ``cleaned`` event: `jobs stop`
runs it as a short job when a stopped job's groups outlive it.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Callable

from raytrain import events, placement
from raytrain.events import emit

POLL_S = 3.0
STATE_TIMEOUT_S = 10  # one state API call (Ray's default is 30 s): the start deadline is checked between calls


def _address() -> str | None:
    """The cluster the job runs on; Ray's "auto" fails on a machine running two Ray clusters."""
    return os.environ.get("RAY_ADDRESS") or None


def _as_dict(item) -> dict:
    if dataclasses.is_dataclass(item):
        return dataclasses.asdict(item)
    if hasattr(item, "model_dump"):
        return item.model_dump()
    return dict(item)


def list_groups() -> list[dict]:
    from ray.util.state import list_placement_groups

    return [_as_dict(g) for g in list_placement_groups(address=_address(), detail=True, limit=10000,
                                                       timeout=STATE_TIMEOUT_S, raise_on_missing_output=False)]


def list_jobs() -> list[dict]:
    from ray.util.state import list_jobs as state_jobs

    out = []
    for job in state_jobs(address=_address(), limit=10000, timeout=STATE_TIMEOUT_S, raise_on_missing_output=False):
        status = getattr(job, "status", "")
        out.append({"job_id": getattr(job, "job_id", None), "submission_id": getattr(job, "submission_id", None),
                    "status": str(getattr(status, "value", status))})
    return out


def remove_groups(groups: list[dict]) -> list[str]:
    """Remove the groups; their ids."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = []
    for group in groups:
        pg_id = group["placement_group_id"]
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        removed.append(pg_id)
    return removed


def remove_leaked() -> list[str]:
    """Remove the live groups whose creator job has ended (never this job's, never detached ones)."""
    import ray

    me = ray.get_runtime_context().get_job_id()
    alive = placement.alive_job_ids(list_jobs()) + [me]
    return remove_groups(placement.leaked(list_groups(), alive))


class StartWatch(threading.Thread):
    """Polls this job's groups: while one waits, a ``waiting`` event (again when the reason changes); once one
    is placed, ``placed``. After ``timeout_s`` of waiting, ``on_timeout(reason)``."""

    def __init__(self, ray_job_id: str, timeout_s: float, on_timeout: Callable[[str], None],
                 poll_s: float = POLL_S):
        super().__init__(name="raytrain-start-watch", daemon=True)
        self.ray_job_id, self.timeout_s, self.on_timeout, self.poll_s = ray_job_id, timeout_s, on_timeout, poll_s
        self.stopped = threading.Event()

    def run(self) -> None:
        since, state = None, None  # state: None, "placed", or the last waiting message
        failing_since, error = None, ""  # when the state API began failing, and its last error
        while not self.stopped.wait(self.poll_s * (5 if state == "placed" else 1)):  # slower once placed
            try:
                groups, jobs = list_groups(), list_jobs()
                failing_since = None
            except Exception as exc:  # noqa: BLE001 - the state API is busy: look again at the next poll
                error = f"{type(exc).__name__}: {exc}".strip()
                failing_since = failing_since or time.monotonic()
                if state == "placed":
                    continue  # the workers started: nothing is left to time out
                # the deadline runs on without the API: a wait it cannot see is a wait all the same
                since = since or failing_since
                if self.timeout_s > 0 and time.monotonic() - since > self.timeout_s:
                    seen = f"; last seen: {state}" if state else ""
                    self.on_timeout(f"the state API that shows the workers' placement has been failing for "
                                    f"{time.monotonic() - failing_since:.0f} s (last error: {error}){seen}")
                    return
                continue
            mine = placement.of_job(groups, self.ray_job_id)
            if placement.placed(mine):
                if state != "placed":
                    emit(events.PLACED, waited_s=round(time.monotonic() - since, 1) if since else 0.0)
                since, state = None, "placed"
                continue
            if not placement.waiting(mine):
                continue  # no group yet, or Ray Train is about to ask again
            since = since or time.monotonic()
            names = {j["job_id"]: j["submission_id"] or j["job_id"] for j in jobs if j.get("job_id")}
            message = placement.waiting_message(mine, groups, names)
            if message != state:
                emit(events.WAITING, message=message, timeout_s=self.timeout_s)
                state = message
            if self.timeout_s > 0 and time.monotonic() - since > self.timeout_s:
                self.on_timeout(message)
                return


def give_up(ray_job_id: str, timeout_s: float, message: str) -> None:
    """The workers could not be placed in time: say why, free the waiting groups, end the driver (exit 1)."""
    emit(events.ERROR, type="StartTimeout", rank=None,
         message=f"the workers did not start within {timeout_s:g} s (--start-timeout): {message}")
    try:
        remove_groups(placement.of_job(list_groups(), ray_job_id))
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def main() -> int:
    import ray

    ray.init(address=_address(), log_to_driver=False)
    emit(events.CLEANED, groups=remove_leaked())
    return 0


if __name__ == "__main__":
    from raytrain.runtime.driver.process_exit import exit_without_finalizing

    exit_without_finalizing(main())
