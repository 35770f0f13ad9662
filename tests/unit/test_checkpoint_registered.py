"""A checkpoint report waits until Ray Train's controller has taken it (a worker dying right after its report
must not take the checkpoint with it); the queue is Ray Train's own one-slot result queue."""
import queue
import threading
import time

from ray.train.v2._internal.execution import context as ray_context

from raytrain.runtime.checkpointer import wait_until_registered


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

    def poll():  # the controller's next poll of this worker
        time.sleep(0.2)
        taken.append(q.get())

    threading.Thread(target=poll).start()
    t0 = time.monotonic()
    assert wait_until_registered(timeout_s=10) is True
    assert taken and time.monotonic() - t0 >= 0.15


def test_gives_up_after_its_timeout_and_outside_ray_train(monkeypatch):
    q = queue.Queue(maxsize=1)
    q.put("never polled")
    monkeypatch.setattr(ray_context, "get_train_context", lambda: _Context(q))
    assert wait_until_registered(timeout_s=0.1) is False

    def no_context():
        raise RuntimeError("not in a Ray Train worker")

    monkeypatch.setattr(ray_context, "get_train_context", no_context)
    assert wait_until_registered(timeout_s=0.1) is False
