"""The training threads of CPU workers bound to cores of their own only where the job's workers fill their node (runtime/core_binding)."""
import os
import threading

import pytest

from raytrain.runtime.worker import core_binding
from raytrain.runtime.worker.core_binding import cores_for
from tests.conftest import needs


def test_each_local_rank_gets_its_own_block_when_the_workers_fill_the_node():
    assert cores_for(0, 2, 1, [1, 0], node_cpus=2.0) == [0]
    assert cores_for(1, 2, 1, [0, 1], node_cpus=2.0) == [1]
    # 2 CPUs per worker on 4 cores: contiguous blocks, in the order the cores are numbered
    assert [cores_for(r, 2, 2, [3, 2, 1, 0], node_cpus=4) for r in (0, 1)] == [[0, 1], [2, 3]]
    # a process allowed only some cores (a cpuset): the blocks come from those
    assert [cores_for(r, 2, 1, [4, 6], node_cpus=2) for r in (0, 1)] == [[4], [6]]


@pytest.mark.parametrize("local_world, per, allowed, node_cpus", [
    (1, 1, [0, 1], 2.0),  # one worker on a 2-core node: the other core is free for someone else
    (2, 1, [0, 1, 2, 3], 4.0),  # workers hold 2 of 4 CPUs: another job may run on the node
    (2, 1, list(range(64)), 2.0),  # a pod whose CPU limit (2) is a quota over the host's 64 cores
    (2, 1, [0, 1], 4.0),  # the node claims more CPUs than this process may use (ray start --num-cpus 4)
    (2, 1, [0, 1], None),  # the node's CPUs unknown
    (2, 0.5, [0], 1.0),  # fractional CPUs: no whole core per worker
    (2, 1.5, [0, 1, 2], 3.0),
])
def test_nothing_is_bound_unless_the_workers_hold_every_core(local_world, per, allowed, node_cpus):
    assert all(cores_for(r, local_world, per, allowed, node_cpus) is None for r in range(local_world))


def test_bind_thread_binds_the_calling_thread_and_what_it_starts_later_only():
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip(needs("2 cores", "one core: nothing to tell apart"))
    one = [min(before)]
    seen: dict[str, set] = {}
    ready, release = threading.Event(), threading.Event()

    def early():  # a thread that exists before the binding (as gloo's and Ray's do): it stays free
        ready.set()
        release.wait(10)
        seen["early"] = os.sched_getaffinity(0)

    t = threading.Thread(target=early)
    t.start()
    ready.wait(10)
    try:
        core_binding.bind_thread(one)
        release.set()
        t.join(10)
        late = threading.Thread(target=lambda: seen.__setitem__("late", os.sched_getaffinity(0)))
        late.start()
        late.join(10)
        assert os.sched_getaffinity(0) == seen["late"] == set(one)
        assert seen["early"] == before
    finally:
        release.set()
        core_binding.bind_thread(sorted(before))
    assert os.sched_getaffinity(0) == before


def test_switched_off_or_on_a_gpu_worker_nothing_is_bound(monkeypatch):
    called = []
    monkeypatch.setattr(core_binding, "bind_thread", called.append)
    monkeypatch.setattr(core_binding, "node_cpus", lambda: float(len(os.sched_getaffinity(0))))
    n = len(os.sched_getaffinity(0))
    monkeypatch.setenv(core_binding.ENV, "0")
    assert core_binding.bind_worker(0, n, 1, use_gpu=False) is None
    monkeypatch.delenv(core_binding.ENV)
    assert core_binding.bind_worker(0, n, 1, use_gpu=True) is None
    assert called == []
    assert core_binding.bind_worker(0, n, 1, use_gpu=False) == [sorted(os.sched_getaffinity(0))[0]]
    assert called == [[sorted(os.sched_getaffinity(0))[0]]]


def test_a_failure_to_learn_the_node_leaves_the_worker_unbound(monkeypatch):
    def unreachable():
        raise RuntimeError("GCS unreachable")

    monkeypatch.setattr(core_binding, "node_cpus", unreachable)
    monkeypatch.setattr(core_binding, "bind_thread", lambda cores: pytest.fail("bound"))
    assert core_binding.bind_worker(0, 1, 1, use_gpu=False) is None


def test_ray_is_asked_about_the_node_only_when_the_workers_could_fill_the_cores(monkeypatch):
    asked = []
    monkeypatch.setattr(core_binding, "node_cpus", lambda: asked.append(1) or 1.0)
    monkeypatch.setattr(core_binding, "bind_thread", lambda cores: None)
    n = len(os.sched_getaffinity(0))
    assert core_binding.bind_worker(0, n + 1, 1, use_gpu=False) is None
    assert asked == []
    core_binding.bind_worker(0, n, 1, use_gpu=False)
    assert asked == [1]
