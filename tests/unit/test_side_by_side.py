"""`pytest -n 2` (tests/conftest.py): the work units each side takes, and an `alone` test running with nothing
beside it."""
import threading
import time

from tests import conftest


def test_a_unit_is_a_test_file_or_a_whole_shared_folder():
    split = conftest._Units._split_scope
    assert split(None, "tests/multinode/test_drain.py::test_x") == "tests/multinode"
    assert split(None, "tests/multinode/test_scaling.py::test_y[a]") == "tests/multinode"
    assert split(None, "tests/k8s/test_rayjob.py::test_z") == "tests/k8s"
    assert split(None, "tests/e2e/test_hang.py::test_a") == "tests/e2e/test_hang.py"
    assert split(None, "tests/unit/test_plan.py::test_b[x::y]") == "tests/unit/test_plan.py"


def _hold(folder, alone, seconds, spans, name, started=None):
    with conftest._side_by_side(folder, alone=alone):
        t0 = time.monotonic()
        if started:
            started.set()
        time.sleep(seconds)
        spans[name] = (t0, time.monotonic())


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_shared_holders_run_together_and_an_alone_one_runs_by_itself(tmp_path):
    spans = {}
    first = threading.Event()
    threads = [threading.Thread(target=_hold, args=(tmp_path, False, 0.6, spans, "a", first))]
    threads[0].start()
    first.wait(5)
    threads.append(threading.Thread(target=_hold, args=(tmp_path, False, 0.6, spans, "b")))
    threads.append(threading.Thread(target=_hold, args=(tmp_path, True, 0.3, spans, "alone")))
    for t in threads[1:]:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(10)
    assert set(spans) == {"a", "b", "alone"}, spans
    assert _overlap(spans["a"], spans["b"]), spans  # two ordinary tests side by side
    assert not _overlap(spans["alone"], spans["a"]) and not _overlap(spans["alone"], spans["b"]), spans


def test_an_alone_test_waiting_is_not_overtaken(tmp_path):
    """Once an `alone` test waits, a later ordinary test waits behind it rather than keeping the room busy."""
    spans = {}
    first = threading.Event()
    holder = threading.Thread(target=_hold, args=(tmp_path, False, 0.6, spans, "a", first))
    holder.start()
    first.wait(5)
    alone = threading.Thread(target=_hold, args=(tmp_path, True, 0.3, spans, "alone"))
    alone.start()
    time.sleep(0.2)  # the alone test is at the gate, waiting for "a"
    late = threading.Thread(target=_hold, args=(tmp_path, False, 0.1, spans, "late"))
    late.start()
    for t in (holder, alone, late):
        t.join(10)
    assert spans["alone"][0] >= spans["a"][1] and spans["late"][0] >= spans["alone"][1], spans
