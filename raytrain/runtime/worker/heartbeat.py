"""Where this rank is: its last finished step and its phase (data, forward, backward, step, checkpoint), kept
in a few attributes the training thread sets (two attribute stores per phase change: no lock, no I/O, no
Ray call), and published every ``BEAT_S`` by a daemon thread to the job's board actor
(raytrain.runtime.driver.hang_watch), which the driver's watchdog and ``raytrain jobs stack`` read. The same thread
answers a stack request with every thread's Python stack (``sys._current_frames``), so a stack is taken even
while the training thread sleeps or waits in a collective (both release the GIL)."""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from raytrain.runtime.worker import collective_time

BEAT_S = 2.0
CALL_TIMEOUT_S = 10.0  # one board call; a board that does not answer is retried at the next beat


class State:
    """The training thread's side: plain attribute stores, read (racily, which is fine) by the beat thread."""

    __slots__ = ("step", "step_done", "phase", "phase_since", "durations", "training_ident", "compute", "timing",
                 "waited", "excluded_s", "waited_in_phase")

    def __init__(self) -> None:
        self.step: int | None = None  # the last step this rank finished (reported)
        self.step_done: float | None = None  # its wall-clock time
        self.phase = "setup"
        self.phase_since = time.time()
        self.durations: deque = deque(maxlen=64)  # recent step times (s): the watchdog's default timeout
        self.training_ident: int | None = None
        # The straggler watch (raytrain.straggler): each step's compute time, [step, s], once timing is on
        # (time_compute); the collectives' wait seconds at the last step; checkpoint seconds since it.
        self.compute: deque = deque(maxlen=256)
        self.timing = False
        self.waited = 0.0
        self.excluded_s = 0.0
        self.waited_in_phase = 0.0

    def time_compute(self) -> None:
        """Measure each step's compute time from now on (raytrain.runtime.worker.collective_time)."""
        self.timing = collective_time.install()
        self.waited = collective_time.seconds()

    def enter(self, phase: str) -> None:
        now = time.time()
        if self.timing and (phase == "checkpoint") != (self.phase == "checkpoint"):  # checkpoints are no compute
            waited = collective_time.seconds()
            if phase == "checkpoint":
                self.waited_in_phase = waited
            else:  # leaving it: its seconds, less its collectives' (the step already leaves those out)
                self.excluded_s += (now - self.phase_since) - (waited - self.waited_in_phase)
        self.phase, self.phase_since = phase, now

    def step_finished(self, step: int) -> None:
        now = time.time()
        if self.step_done is not None and self.step is not None and step > self.step:
            steps = step - self.step
            self.durations.append((now - self.step_done) / steps)
            if self.timing:
                waited = collective_time.seconds()
                busy = (now - self.step_done) - (waited - self.waited) - self.excluded_s
                self.compute.append((step, round(max(busy, 0.0) / steps, 6)))
        if self.timing:
            self.waited, self.excluded_s = collective_time.seconds(), 0.0
        self.step, self.step_done = step, now
        self.phase, self.phase_since = "data", now  # until the next forward: the job fetches its next batch

    def median_step_s(self) -> float | None:
        times = sorted(self.durations)
        return times[len(times) // 2] if times else None

    def snapshot(self) -> dict[str, Any]:
        return {"step": self.step, "step_done": self.step_done, "phase": self.phase,
                "phase_since": self.phase_since, "median_step_s": self.median_step_s(),
                **({"compute": list(self.compute)} if self.timing else {})}


STATE = State()
ON_HANG: list = []  # rank 0: callables given each new hang or straggler summary (--track's trackers note it)


def capture_stacks(training_ident: int | None = None) -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first; the training thread first and marked."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name} for f in traceback.extract_stack(frame)]
        out.append({"thread": names.get(ident, str(ident)), "training": ident == training_ident, "frames": frames})
    out.sort(key=lambda t: not t["training"])
    return out


def instrument(engine: Any) -> Any:
    """Phase marks around a DeepSpeed engine's forward, backward and step (and a pipeline's train_batch):
    a wrapper that sets two attributes, then calls the engine's own method unchanged."""
    state = STATE

    def marked(phase: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            state.phase, state.phase_since = phase, time.time()
            return method(*args, **kwargs)
        return call

    try:
        engine.register_forward_pre_hook(lambda *_: state.enter("forward"))
        for name, phase in (("backward", "backward"), ("step", "step"), ("train_batch", "forward")):
            method = getattr(engine, name, None)
            if callable(method):
                setattr(engine, name, marked(phase, method))
    except Exception:  # noqa: BLE001 (an engine of another kind: phases stay coarse, training goes on)
        pass
    return engine


class Beat(threading.Thread):
    """The daemon thread that publishes STATE to the board and answers its requests."""

    def __init__(self, board: Any, rank: int, node: str):
        super().__init__(name="raytrain-heartbeat", daemon=True)
        self.board, self.rank, self.node = board, rank, node
        self.stopped = threading.Event()

    def run(self) -> None:
        import ray

        answered, hang_seen, straggler_seen = 0, 0, 0
        while not self.stopped.is_set():
            try:
                beat = {**STATE.snapshot(), "rank": self.rank, "node": self.node, "pid": os.getpid()}
                reply = ray.get(self.board.beat.remote(beat), timeout=CALL_TIMEOUT_S) or {}
                if reply.get("exit"):  # --on-hang restart: this worker group ends; Ray Train starts a new one
                    sys.stderr.write("raytrain: the hang watchdog restarts the workers\n")
                    sys.stderr.flush()
                    os._exit(1)
                if reply.get("preempt"):  # the driver got a SIGTERM: checkpoint at the next step boundary
                    from raytrain.runtime.worker import preemption

                    preemption.notify(str(reply["preempt"]), reply.get("preempt_deadline"))
                hung = reply.get("hang") or {}
                if hung.get("seq", 0) > hang_seen:
                    hang_seen = hung["seq"]
                    for listener in ON_HANG:
                        listener({"hang": {k: v for k, v in hung.items() if k != "seq"}})
                straggler = reply.get("straggler") or {}
                if straggler.get("seq", 0) > straggler_seen:  # the straggler watch's latest episode
                    straggler_seen = straggler["seq"]
                    for listener in ON_HANG:
                        listener({"straggler": {k: v for k, v in straggler.items() if k != "seq"}})
                request = int(reply.get("stacks") or 0)
                if request > answered:
                    answered = request
                    stacks = capture_stacks(STATE.training_ident)
                    ray.get(self.board.stacks.remote(self.rank, request, {**beat, "threads": stacks}),
                            timeout=CALL_TIMEOUT_S)
                    continue  # another request may be waiting: beat again at once
            except Exception:  # noqa: BLE001 (a board that is gone or slow: the next beat tries again)
                pass
            self.stopped.wait(BEAT_S)


def start(rank: int, time_compute: bool = True) -> Beat | None:
    """Mark the calling thread as the training thread and start beating to this job's board (None: no board).
    ``time_compute``: measure each step's compute time for the straggler watch (off with ``--hang-timeout 0``,
    which turns the driver's watchdog off)."""
    import ray

    from raytrain.runtime.driver import hang_watch

    STATE.training_ident = threading.get_ident()
    if time_compute:
        STATE.time_compute()
    try:
        board = ray.get_actor(hang_watch.board_name(ray.get_runtime_context().get_job_id()),
                              namespace=hang_watch.NAMESPACE)
    except Exception:  # noqa: BLE001 (a driver without a board: no heartbeats, training goes on)
        return None
    beat = Beat(board, rank, ray.util.get_node_ip_address())
    beat.start()
    return beat
