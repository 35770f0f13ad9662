"""The hang watchdog's decisions and the per-rank stack summary (raytrain.hang), the heartbeat's step
accounting and stack capture (raytrain.runtime.worker.heartbeat), the board, and the options that drive them."""
import os
import threading
import time

import pytest

from raytrain import hang
from raytrain.errors import ConfigError
from raytrain.events import HANG, METRICS, JobFacts

NOW = 1_000_000.0


def beat(rank, done_ago, median=None):
    return {"rank": rank, "step": 5, "step_done": NOW - done_ago, "median_step_s": median}


def test_default_timeout_is_ten_median_steps_or_120_s():
    assert hang.hang_timeout(None, None) == 120.0
    assert hang.hang_timeout(None, 2.0) == 120.0
    assert hang.hang_timeout(None, 30.0) == 300.0
    assert hang.hang_timeout(20.0, 30.0) == 20.0  # given: as given
    assert hang.hang_timeout(0.0, 30.0) is None  # 0: off


@pytest.mark.parametrize("on_hang", ["report", "restart", "fail"])
def test_no_hang_while_any_rank_finishes_steps(on_hang):
    # rank 1 is stuck for long, but rank 0 finished a step 5 s ago: progress (the timeout is "no rank")
    beats = [beat(0, 5), beat(1, 500)]
    assert hang.decide(NOW, beats, option=20, on_hang=on_hang, collective_timeout_s=600, reported=False)[0] is None


def test_not_armed_before_the_first_step():
    beats = [{"rank": 0, "step": None, "step_done": None}, {"rank": 1, "step": None, "step_done": None}]
    assert hang.decide(NOW, beats, option=20, on_hang="fail", collective_timeout_s=600, reported=False) == (
        None, None, 20)


def test_actions():
    beats = [beat(0, 25), beat(1, 30)]
    decide = lambda **kw: hang.decide(NOW, beats, collective_timeout_s=600, **kw)[0]  # noqa: E731
    assert decide(option=20, on_hang="report", reported=False) == "report"
    assert decide(option=20, on_hang="report", reported=True) is None  # once per hang
    assert decide(option=20, on_hang="restart", reported=False) == "restart"
    assert decide(option=20, on_hang="fail", reported=False) == "fail"
    assert decide(option=30, on_hang="fail", reported=False) is None  # 25 s idle < 30 s
    assert decide(option=0, on_hang="fail", reported=False) is None  # watchdog off


def test_report_fails_after_the_collective_timeout():
    beats = [beat(0, 620), beat(1, 700)]
    assert hang.decide(NOW, beats, option=20, on_hang="report", collective_timeout_s=600, reported=True)[0] is None
    beats = [beat(0, 631), beat(1, 700)]
    assert hang.decide(NOW, beats, option=20, on_hang="report", collective_timeout_s=600, reported=True)[0] == "fail"


def test_default_timeout_follows_the_slowest_ranks_median_step():
    beats = [beat(0, 200, median=1.0), beat(1, 200, median=25.0)]  # 10 x 25 s = 250 s > 200 s idle
    assert hang.decide(NOW, beats, option=None, on_hang="fail", collective_timeout_s=600, reported=False)[0] is None
    beats = [beat(0, 260, median=1.0), beat(1, 260, median=25.0)]
    assert hang.decide(NOW, beats, option=None, on_hang="fail", collective_timeout_s=600, reported=False)[0] == "fail"


def frame(file, line, function):
    return {"file": file, "line": line, "function": function}


TORCH = "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
DS = "/venv/lib/python3.12/site-packages/deepspeed/comm/torch.py"
ENGINE = "/venv/lib/python3.12/site-packages/deepspeed/runtime/worker/engine.py"
JOBF = "/jobs/train.py"


def report(rank, frames, step=5):
    return {"rank": rank, "node": "10.0.0.1", "pid": 10 + rank, "step": step, "step_done": NOW - 42,
            "phase": "backward",
            "threads": [{"thread": "other", "training": False, "frames": [frame("/x/threading.py", 1, "wait")]},
                        {"thread": "train", "training": True, "frames": frames}]}


def test_summary_names_collective_and_non_collective_ranks():
    waiting = report(0, [frame(JOBF, 10, "train"), frame(JOBF, 30, "train_step"), frame(ENGINE, 2000, "backward"),
                         frame(DS, 50, "all_reduce"), frame(TORCH, 2500, "all_reduce")])
    stuck = report(1, [frame(JOBF, 10, "train"), frame(JOBF, 15, "stuck_loader")])
    summary = hang.summarize({0: waiting, 1: stuck}, NOW)
    assert summary[0]["collective"] == "all_reduce" and summary[0]["where"] == "train_step (train.py:30)"
    assert summary[1]["collective"] is None and summary[1]["where"] == "stuck_loader (train.py:15)"
    assert summary[1]["file"] == JOBF and summary[1]["line"] == 15
    lines = hang.lines(summary)
    assert lines[0] == ("rank 0 (10.0.0.1): waiting in a collective (all_reduce) called from train_step "
                        "(train.py:30) for 42 s, after step 5")
    assert lines[1] == "rank 1 (10.0.0.1): not in a collective: in stuck_loader (train.py:15) for 42 s (phase backward), after step 5"


def test_summary_names_a_rank_that_gave_no_stack():
    summary = hang.summarize({0: report(0, [frame(JOBF, 1, "train")])}, NOW, world_size=2)
    assert hang.lines(summary)[1] == "rank 1: gave no stack (its process did not answer)"


def test_a_stack_is_printed_innermost_first():
    text = hang.format_stack(report(1, [frame(JOBF, 10, "train"), frame(JOBF, 15, "stuck_loader")]))
    assert text[0].startswith("rank 1 (pid 11, 10.0.0.1): step 5")
    train = text.index("  thread train (training):")
    assert text[train + 1:train + 3] == [f"    stuck_loader ({JOBF}:15)", f"    train ({JOBF}:10)"]


def test_heartbeat_step_times_and_phases():
    from raytrain.runtime.worker.heartbeat import State

    state = State()
    state.enter("forward")
    assert state.snapshot()["phase"] == "forward" and state.median_step_s() is None
    state.step_finished(1)
    state.step_done -= 2.0  # as if step 1 ended 2 s ago
    state.step_finished(2)
    assert state.snapshot()["phase"] == "data" and state.step == 2
    assert 1.9 < state.median_step_s() < 2.5


def test_stacks_are_taken_from_a_sleeping_thread():
    from raytrain.runtime.worker.heartbeat import capture_stacks

    ready, ident = threading.Event(), []

    def sleeper_fn():
        ident.append(threading.get_ident())
        ready.set()
        time.sleep(30)

    t = threading.Thread(target=sleeper_fn, daemon=True, name="sleeper")
    t.start()
    assert ready.wait(10)
    threads = capture_stacks(ident[0])
    assert threads[0]["training"] and threads[0]["thread"] == "sleeper"
    assert threads[0]["frames"][-1]["function"] == "sleeper_fn"
    assert threads[0]["frames"][-1]["file"] == os.path.abspath(__file__)
    summary = hang.summarize_rank({"rank": 3, "threads": threads, "step_done": time.time()}, time.time())
    assert summary["function"] == "sleeper_fn" and summary["collective"] is None


def test_board_requests_stacks_and_orders_restarts():
    from raytrain.runtime.driver.hang_watch import Board

    board = Board()
    assert board.beat({"rank": 0, "pid": 1}) == {"stacks": 0}
    request = board.request_stacks()
    assert board.beat({"rank": 1, "pid": 2}) == {"stacks": request}
    board.stacks(1, request, {"rank": 1})
    board.stacks(0, request - 1, {"rank": 0})  # an answer to an older request is dropped
    assert board.answers_to(request) == {1: {"rank": 1}}
    board.restart()
    assert board.beat({"rank": 0, "pid": 1}) == {"exit": True} and board.snapshot() == []
    assert board.beat({"rank": 0, "pid": 3}) == {"stacks": request}  # the next worker group's process


def test_hang_event_shows_until_the_next_step():
    facts = JobFacts()
    facts.add({"event": HANG, "idle_s": 31.0, "action": "reporting", "lines": ["rank 1: not in a collective"]})
    assert facts.warnings() == ["hung: no step finished for 31 s (reporting): rank 1: not in a collective"]
    facts.add({"event": METRICS, "step": 6})
    assert facts.warnings() == []


def test_options(tmp_path):
    from raytrain.config.options import Options
    from raytrain.config.resolve import resolve

    job = tmp_path / "job.py"
    job.write_text("def train(ctx):\n    pass\n")
    plan = resolve(Options(job=str(job), hang_timeout=20.0, on_hang="fail"))
    assert (plan.hang_timeout_s, plan.on_hang) == (20.0, "fail")
    plan = resolve(Options(job=str(job)))
    assert (plan.hang_timeout_s, plan.on_hang) == (None, "report")
    with pytest.raises(ConfigError, match="--hang-timeout -1"):
        resolve(Options(job=str(job), hang_timeout=-1.0))
    with pytest.raises(ConfigError, match="--on-hang restart.*--max-failures"):
        resolve(Options(job=str(job), on_hang="restart"))


def test_a_hang_summary_is_noted_in_the_trackers(tmp_path):
    from tests.unit.test_trackers import mlflow_runs, plan, run_attempt

    p = plan(tmp_path, ["mlflow"])
    t = run_attempt(p, range(1, 4))
    t.note({"hang": {"idle_s": 21.0, "lines": ["rank 1: not in a collective: in stuck (job.py:15) for 22 s"]}})
    t.flush(timeout_s=60)
    runs, _ = mlflow_runs(p)
    tags = runs[0].data.tags
    assert tags["summary.hang.idle_s"] == "21.0", tags
    assert "stuck (job.py:15)" in tags["summary.hang.lines"], tags
    t.finish({})
