"""The job's board (a small named actor the driver creates: every rank's heartbeat lands there, stack requests
go out from there) and the driver's hang watchdog (raytrain.hang decides; this module acts).

``python -m raytrain.runtime.driver.hang_watch SUBMISSION_ID`` asks that job's board for every rank's stack now and
prints one ``stacks`` event: `raytrain jobs stack` runs it as a short job on the job's cluster.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from raytrain import events, hang, straggler
from raytrain.events import emit

NAMESPACE = "raytrain"
POLL_S = 2.0
STACK_WAIT_S = 15.0  # every rank answers at its next beat (heartbeat.BEAT_S); a rank that does not is named
CALL_TIMEOUT_S = 10.0


def board_name(ray_job_id: str) -> str:
    return f"raytrain-board-{ray_job_id}"


class Board:
    """Latest heartbeat per rank; stack requests and their answers; the restart order."""

    def __init__(self) -> None:
        self.beats: dict[int, dict] = {}
        self.request = 0
        self.answers: dict[int, dict] = {}  # rank -> its stack report for self.request
        self.exiting: set[int] = set()  # pids told to exit (--on-hang restart)
        self.hang: dict | None = None  # the latest hang's summary: rank 0 notes it in --track's trackers
        self.straggler: dict | None = None  # the latest straggler episode's change: noted the same way
        self.rollbacks: list[dict] = []  # the job's rollbacks (runtime.worker.rollback): the rows each one skips
        self.preempt_reason: str | None = None  # the driver got a SIGTERM: every rank's preemption notice
        self.preempt_deadline: float | None = None  # by when (seconds since the epoch) the driver ends the job
        self.preempt_outcome: dict | None = None  # the checkpoint the driver's notice led to (a worker tells)

    def beat(self, beat: dict) -> dict:
        if beat.get("pid") in self.exiting:
            return {"exit": True}
        self.beats[int(beat["rank"])] = {**beat, "seen": time.time()}
        return {"stacks": self.request, **({"hang": self.hang} if self.hang else {}),
                **({"straggler": self.straggler} if self.straggler else {}),
                **({"preempt": self.preempt_reason, "preempt_deadline": self.preempt_deadline}
                   if self.preempt_reason else {})}

    def preempt(self, reason: str, deadline: float | None = None) -> None:
        """Every rank gets a preemption notice at its next beat (raytrain.runtime.worker.preemption)."""
        self.preempt_reason, self.preempt_deadline = reason, deadline

    def preempted(self, outcome: dict) -> None:
        """A worker: the checkpoint the driver's notice led to is committed (or was refused), ``outcome``."""
        self.preempt_outcome = outcome

    def preempt_state(self) -> dict:
        """For the driver's stop: the workers' answer to its notice (None: not yet), and how many ranks beat."""
        return {"outcome": self.preempt_outcome, "ranks": len(self.beats)}

    def hung(self, summary: dict) -> None:
        self.hang = {**summary, "seq": (self.hang or {}).get("seq", 0) + 1}

    def straggling(self, event: dict) -> None:
        self.straggler = {**event, "seq": (self.straggler or {}).get("seq", 0) + 1}

    def stacks(self, rank: int, request: int, report: dict) -> None:
        if request == self.request:
            self.answers[int(rank)] = report

    def request_stacks(self) -> int:
        self.request += 1
        self.answers = {}
        return self.request

    def answers_to(self, request: int) -> dict[int, dict]:
        return dict(self.answers) if request == self.request else {}

    def snapshot(self) -> list[dict]:
        return list(self.beats.values())

    def note_rollback(self, entry: dict) -> int:
        """A rollback's record (kept across worker groups); how many the job has had."""
        self.rollbacks.append(entry)
        return len(self.rollbacks)

    def rollback_log(self) -> list[dict]:
        return list(self.rollbacks)

    def restart(self) -> None:
        """Every rank that beats now exits at its next beat; the next worker group starts with a clean board."""
        self.exiting |= {b["pid"] for b in self.beats.values() if b.get("pid")}
        self.beats, self.answers = {}, {}


def create_board() -> Any:
    """The board of the calling driver's job (one CPU-less actor pinned to the driver's node, the head: see
    raytrain.runtime.driver.head; left to Ray, a CPU-less actor goes to a random node, which may be lost)."""
    import ray

    from raytrain.runtime.driver import head

    actor = ray.remote(num_cpus=0, max_concurrency=16, scheduling_strategy=head.pinned_here())(Board)
    name = board_name(ray.get_runtime_context().get_job_id())
    return actor.options(name=name, namespace=NAMESPACE, lifetime=None).remote()


def collect_stacks(board: Any, world_size: int | None, wait_s: float = STACK_WAIT_S) -> dict[int, dict]:
    """Every rank's stack report (all threads), waiting at most ``wait_s`` for all of ``world_size`` ranks."""
    import ray

    request = ray.get(board.request_stacks.remote(), timeout=CALL_TIMEOUT_S)
    deadline = time.monotonic() + wait_s
    answers: dict[int, dict] = {}
    while time.monotonic() < deadline:
        answers = ray.get(board.answers_to.remote(request), timeout=CALL_TIMEOUT_S)
        expected = world_size or len(ray.get(board.snapshot.remote(), timeout=CALL_TIMEOUT_S))
        if expected and len(answers) >= expected:
            break
        time.sleep(0.25)
    return answers


class Watchdog(threading.Thread):
    """Polls the board every POLL_S; on a hang captures every rank's stack, emits a ``hang`` event and acts
    on ``--on-hang``. ``fail(reason)`` ends the job (the driver's)."""

    def __init__(self, board: Any, *, option: float | None, on_hang: str, collective_timeout_s: float,
                 fail: Callable[[str], None]):
        super().__init__(name="raytrain-hang-watchdog", daemon=True)
        self.board, self.option, self.on_hang = board, option, on_hang
        self.collective_timeout_s, self.fail = collective_timeout_s, fail
        self.stopped = threading.Event()
        self.summary: list[str] = []  # the last hang's lines: a failure's reason
        self.stragglers = straggler.Detector()  # the straggler watch runs on the same polls

    def run(self) -> None:
        reported_at: float | None = None  # the step time of the hang already reported
        said = ""
        while not self.stopped.wait(POLL_S):
            try:
                import ray

                beats = ray.get(self.board.snapshot.remote(), timeout=CALL_TIMEOUT_S)
                self.watch_stragglers(self.stragglers.update(beats))
                last = max((b["step_done"] for b in beats if b.get("step_done")), default=None)
                reported = reported_at is not None and reported_at == last
                action, idle, timeout = hang.decide(
                    time.time(), beats, option=self.option, on_hang=self.on_hang,
                    collective_timeout_s=self.collective_timeout_s, reported=reported)
                if action is None:
                    if last is not None and not reported:  # steps again: an earlier hang is no failure's reason
                        self.summary = []
                    continue
                if not reported:
                    self.report(idle, timeout, action, ranks=max(len(beats), 1))
                    reported_at = last
                if action == "restart":
                    ray.get(self.board.restart.remote(), timeout=CALL_TIMEOUT_S)
                    self.watch_stragglers(self.stragglers.reset())
                    reported_at = None
                elif action == "fail":
                    self.fail("hung: no step finished for {:.0f} s; {}".format(idle, "; ".join(self.summary)))
                    return
            except Exception as exc:  # noqa: BLE001 (a slow board: the next poll tries again)
                problem = f"raytrain: hang watchdog: {type(exc).__name__}: {exc}"
                if problem != said:  # once per distinct problem, not every poll
                    said = problem
                    print(problem, file=sys.stderr)

    def watch_stragglers(self, changes: list[dict]) -> None:
        """Each straggler episode's start and end: one event each (the log, status, progress) and a note to
        rank 0 (the trackers)."""
        import ray

        for change in changes:
            emit(events.STRAGGLER, **change)
            try:
                ray.get(self.board.straggling.remote(change), timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 (the trackers miss this note; the event is in the log)
                print(f"raytrain: straggler note: {type(exc).__name__}: {exc}", file=sys.stderr)

    def report(self, idle: float, timeout: float, action: str, ranks: int) -> None:
        """``ranks``: how many ranks beat in this worker group (an elastic group may be smaller than the plan's)."""
        reports = collect_stacks(self.board, ranks)
        summary = hang.summarize(reports, time.time(), ranks)
        self.summary = hang.lines(summary)
        then = {"report": "reporting", "restart": "restarting the workers", "fail": "failing the job"}[action]
        emit(events.HANG, idle_s=round(idle, 1), timeout_s=round(timeout, 1), action=then, ranks=summary,
             lines=self.summary)
        import ray

        ray.get(self.board.hung.remote({"idle_s": round(idle, 1), "action": then, "lines": self.summary}),
                timeout=CALL_TIMEOUT_S)


def start_watchdog(plan: Any, fail: Callable[[str], None]) -> tuple[Any, Watchdog | None]:
    """The board, and the watchdog (None with ``--hang-timeout 0``)."""
    board = create_board()
    if plan.hang_timeout_s == 0:
        return board, None
    dog = Watchdog(board, option=plan.hang_timeout_s, on_hang=plan.on_hang, collective_timeout_s=plan.timeout_s,
                   fail=fail)
    dog.start()
    return board, dog


def job_id_of(submission_id: str) -> str | None:
    from raytrain.runtime.driver import placement_watch

    for job in placement_watch.list_jobs():
        if job.get("submission_id") == submission_id:
            return job.get("job_id")
    return None


def main(argv: list[str]) -> int:
    """`raytrain jobs stack`'s job: one ``stacks`` event (every rank's report, or why there is none)."""
    import os

    import ray

    submission_id = argv[0]
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, logging_level="WARNING")
    job_id = job_id_of(submission_id)
    try:
        board = ray.get_actor(board_name(job_id or ""), namespace=NAMESPACE)
    except ValueError:
        emit(events.STACKS, job=submission_id, ranks=[], message=f"job {submission_id} has no running workers "
             "(not started, ended, or started by a raytrain without heartbeats)")
        return 0
    reports = collect_stacks(board, None)
    emit(events.STACKS, job=submission_id, ranks=[reports[r] for r in sorted(reports)],
         summary=hang.summarize(reports, time.time()))
    return 0


if __name__ == "__main__":
    from raytrain.runtime.driver.process_exit import exit_without_finalizing

    exit_without_finalizing(main(sys.argv[1:]))
