"""A checkpoint report waits until Ray Train's controller has taken it (a worker dying right after its report
must not take the checkpoint with it); the queue is Ray Train's own one-slot result queue."""
import queue
import threading
import time

from ray.train.v2._internal.execution import context as ray_context

from raytrain.runtime.checkpoint.lifecycle import wait_until_registered


class _Context:
    def __init__(self, q):
        self.q = q

    def get_result_queue(self):
        return self.q


def test_waits_for_the_controllers_poll_then_returns(monkeypatch):
    q = queue.Queue(maxsize=1)  # what Ray Train's worker holds
    q.put("the report with its checkpoint")
    monkeypatch.setattr(ray_context, "get_train_context", lambda: _Context(q))
    taken = []

    def controller():  # polls the worker every 0.2 s, as Ray Train's controller does
        for _ in range(3):
            time.sleep(0.2)
            try:
                taken.append((time.monotonic(), q.get_nowait()))
            except queue.Empty:
                taken.append((time.monotonic(), None))

    threading.Thread(target=controller).start()
    assert wait_until_registered(timeout_s=10) is True
    done = time.monotonic()
    # returned only after the poll that took the report and the next one (which proves the first answered)
    assert taken[0][1] == "the report with its checkpoint" and len(taken) >= 2 and done >= taken[1][0]


def test_gives_up_after_its_timeout_and_outside_ray_train(monkeypatch):
    q = queue.Queue(maxsize=1)
    q.put("never polled")
    monkeypatch.setattr(ray_context, "get_train_context", lambda: _Context(q))
    assert wait_until_registered(timeout_s=0.1) is False

    def no_context():
        raise RuntimeError("not in a Ray Train worker")

    monkeypatch.setattr(ray_context, "get_train_context", no_context)
    assert wait_until_registered(timeout_s=0.1) is False
