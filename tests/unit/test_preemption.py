"""Preemption notices (SIGTERM, the preStop's notice file), the step-boundary decision, goodput's accounting and
the Kubernetes grace period / preStop rule; the end-to-end runs are tests/e2e/test_preemption.py and
tests/multinode/test_drain.py."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from raytrain.clusters.k8s_manifests import GRACE_MARGIN_S, PREEMPT_FILE, grace_seconds, render_raycluster_spec
from raytrain.clusters.profiles import parse_cluster_profile
from raytrain.errors import ConfigError
from raytrain.events import JobFacts, format_event
from raytrain import goodput


# -- notices --------------------------------------------------------------------------------------------
def test_sigterm_is_recorded_as_a_notice_and_a_second_one_ends_the_process(tmp_path):
    """A real SIGTERM to a real process: the first only records the notice (training goes on to the step
    boundary), a second one is taken as meant and ends the process as the previous handler would."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from raytrain.runtime.worker import preemption
        assert preemption.install()
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while preemption.current() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        print("notice:", preemption.current().reason, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        print("still alive", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert "notice: SIGTERM" in proc.stdout, proc.stdout + proc.stderr
    assert "still alive" not in proc.stdout and proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout)


def test_install_off_the_main_thread_says_so():
    import threading

    from raytrain.runtime.worker import preemption

    out = []
    t = threading.Thread(target=lambda: out.append(preemption.install()))
    t.start()
    t.join()
    assert out == [False]


def test_the_notice_file_brings_its_deadline(tmp_path, monkeypatch):
    from raytrain.runtime.worker import preemption

    path = tmp_path / "notice"
    monkeypatch.setenv("RAYTRAIN_PREEMPT_FILE", str(path))
    monkeypatch.setattr(preemption, "POLL_S", 0.01)
    preemption.reset()
    stop = __import__("threading").Event()
    watcher = __import__("threading").Thread(target=preemption._watch, args=(None, preemption.notice_file(), stop))
    watcher.start()
    try:
        time.sleep(0.1)
        assert preemption.current() is None  # no file, no notice
        deadline = time.time() + 42
        path.write_text(f"{deadline:.0f}\n")
        end = time.monotonic() + 10
        while preemption.current() is None and time.monotonic() < end:
            time.sleep(0.01)
        notice = preemption.current()
        assert notice.reason == "preStop notice" and notice.deadline == pytest.approx(round(deadline), abs=1)
        preemption.mark_done()
        assert (tmp_path / "notice.done").exists()  # the preStop hook may return now
    finally:
        stop.set()
        watcher.join()
        preemption.reset()


def test_a_later_notice_only_brings_the_deadline_forward():
    from raytrain.runtime.worker import preemption

    preemption.reset()
    try:
        preemption.notify("node drain", 2000.0)
        preemption.notify("SIGTERM", 1000.0)
        preemption.notify("SIGTERM", 3000.0)
        assert (preemption.current().reason, preemption.current().deadline) == ("node drain", 1000.0)
    finally:
        preemption.reset()


def test_agreed_on_one_rank():
    from raytrain.runtime.worker import preemption

    preemption.reset()
    try:
        assert preemption.agreed(rank=0, device="cpu", world_size=1) == (False, -1, None)
        preemption.notify("SIGTERM", time.time() + 100)
        noticed, who, left = preemption.agreed(rank=0, device="cpu", world_size=1)
        assert noticed and who == 0 and 98 < left <= 100
    finally:
        preemption.reset()


class _Checkpoints:
    def __init__(self):
        self.last_saved_step = None
        self.waited = 0

    def wait_in_flight(self):  # sync saves here: nothing in flight
        self.waited += 1
        return 0.0


class _Ctx:
    """What preemption.check reads of ctx; ``_save`` records the step it saved."""

    def __init__(self, last_save_s):
        self.rank, self.world_size, self.engine = 0, 1, None
        self.last_save_s = last_save_s
        self._checkpoints = _Checkpoints()
        self.saved = []

    def _save(self, metrics):
        self.saved.append(metrics["step"])
        self._checkpoints.last_saved_step = metrics["step"]
        self.last_save_s = 0.5


def test_a_notice_saves_the_step_and_raises(capsys):
    from raytrain.runtime.worker import preemption

    preemption.reset()
    ctx = _Ctx(last_save_s=None)
    preemption.check(ctx, {"step": 3})  # no notice: nothing happens
    assert ctx.saved == []
    preemption.notify("SIGTERM")
    try:
        with pytest.raises(preemption.Preempted, match=r"preempted: SIGTERM on rank 0 \(node .*\): checkpoint of "
                                                       r"step 4 committed in 0.5 s"):
            preemption.check(ctx, {"step": 4})
        assert ctx.saved == [4]
        facts = JobFacts.from_lines(capsys.readouterr().out.splitlines())
        assert facts.preempted[0]["saved"] is True and facts.preempted[0]["save_s"] == 0.5
    finally:
        preemption.reset()


def test_a_deadline_shorter_than_the_last_save_writes_no_checkpoint(capsys):
    from raytrain.runtime.worker import preemption

    preemption.reset()
    ctx = _Ctx(last_save_s=20.0)
    preemption.notify("node drain", time.time() + 5)
    try:
        with pytest.raises(preemption.Preempted, match=r"shorter than the last save \(20.0 s\): no checkpoint of "
                                                       r"step 7 written"):
            preemption.check(ctx, {"step": 7})
        assert ctx.saved == []
        (event,) = JobFacts.from_lines(capsys.readouterr().out.splitlines()).preempted
        assert event["saved"] is False and event["save_s"] == 20.0 and 0 < event["deadline_s"] <= 5
    finally:
        preemption.reset()


# -- goodput --------------------------------------------------------------------------------------------
def _facts(*events):
    return JobFacts.from_lines(format_event(kind, **data) for kind, data in events)


def _m(step, t, step_time=1.0, **extra):
    return ("metrics", {"step": step, "wall_time": t, "step_time_s": step_time, **extra})


def test_goodput_parts_of_a_run_with_a_failure_add_up():
    facts = _facts(
        _m(1, 100.0), _m(2, 101.0), ("checkpoint_stall", {"step": 2, "stall_s": 0.5, "time": 101.5}),
        _m(3, 102.5), _m(4, 103.5, data_wait_s=0.25),
        ("restarting", {"attempt": 2, "time": 105.0}),  # step 5 was in progress; steps 3-4 are redone
        _m(3, 115.0), _m(4, 116.0), _m(5, 117.0),
        ("checkpoint_stall", {"step": 5, "stall_s": 1.0, "time": 118.0}),
        ("finished", {"time": 118.5}),
    )
    g = goodput.goodput(facts)
    p = g["parts"]
    assert g["wall_s"] == 18.5 and sum(p.values()) == pytest.approx(g["wall_s"], abs=1e-6)
    assert p["checkpoint"] == pytest.approx(1.5)
    assert p["data"] == pytest.approx(0.25)
    # lost: steps 3 and 4's first run (less step 3's save stall and step 4's data wait) and the time from
    # the last report to the restart
    assert p["lost"] == pytest.approx((1.5 - 0.5) + (1.0 - 0.25) + 1.5)
    assert p["restarts"] == pytest.approx(10.0 - 1.0)  # restart to the new group's first step, less that step
    assert p["steps"] == pytest.approx(1 + 1 + 1 + 1)  # steps 2, 3, 4, 5 that counted (1 is the origin)
    assert p["other"] == pytest.approx(0.5)
    assert g["goodput"] == pytest.approx(4 / 18.5, abs=1e-3)
    assert "goodput" not in goodput.describe(None) and "% of 18.5 s" in goodput.describe(g)


def test_goodput_of_a_running_job_counts_to_now_and_needs_a_report():
    assert goodput.goodput(_facts(("started", {}))) is None
    g = goodput.goodput(_facts(_m(1, 10.0), _m(2, 11.0)), now=15.0, job_start=4.0)
    assert g["wall_s"] == 5.0 and g["parts"]["other"] == 4.0 and g["startup_s"] == 6.0


# -- Kubernetes -----------------------------------------------------------------------------------------
def _k8s(extra=None):
    return parse_cluster_profile({"kind": "kuberay", **(extra or {})})


def test_worker_pods_get_a_grace_period_from_the_planned_save_and_a_prestop():
    profile = _k8s({"preemption": {"save-seconds": 40}})
    assert grace_seconds(profile) == 2 * 40 + GRACE_MARGIN_S
    spec = render_raycluster_spec(profile, owner="x")
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] == 110
    container = worker["containers"][0]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"] and PREEMPT_FILE in command[2] and "105" in command[2]
    assert {"name": "RAYTRAIN_PREEMPT_FILE", "value": PREEMPT_FILE} in container["env"]
    head = spec["headGroupSpec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in head and "lifecycle" not in head["containers"][0]
    assert grace_seconds(_k8s({"preemption": {"grace-seconds": 600}})) == 600  # the profile's override


def test_the_prestop_script_writes_the_deadline_and_returns_when_the_workers_are_done(tmp_path):
    """The hook's own shell script, run here with the notice file moved into tmp_path."""
    profile = _k8s({"preemption": {"grace-seconds": 60}})
    spec = render_raycluster_spec(profile, owner="x")
    script = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
    script = script["command"][2].replace(PREEMPT_FILE, str(tmp_path / "notice"))
    proc = subprocess.Popen(["/bin/sh", "-c", script])
    try:
        end = time.monotonic() + 10
        while not (tmp_path / "notice").exists() and time.monotonic() < end:
            time.sleep(0.02)
        assert abs(float((tmp_path / "notice").read_text()) - (time.time() + 55)) < 3
        assert proc.poll() is None  # it waits for the workers' checkpoint
        (tmp_path / "notice.done").write_text("1")
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_bad_planned_save_time_is_refused(value):
    with pytest.raises(ConfigError, match=r"preemption.save-seconds .*: must be a number of seconds > 0"):
        _k8s({"preemption": {"save-seconds": value}})


def test_a_bad_grace_period_is_refused():
    with pytest.raises(ConfigError, match=r"preemption.grace-seconds -5: must be an integer >= 0"):
        _k8s({"preemption": {"grace-seconds": -5}})


def test_a_driver_sigterm_reaches_every_rank_through_the_board():
    """The driver's SIGTERM handler marks the job's board; every rank's next beat reply carries the notice."""
    from raytrain.runtime.driver.hang_watch import Board

    board = Board()
    assert "preempt" not in board.beat({"rank": 0, "pid": 1})
    board.preempt("driver SIGTERM")
    assert board.beat({"rank": 1, "pid": 2})["preempt"] == "driver SIGTERM"


def test_the_trackers_get_the_runs_goodput_through_the_reports():
    """Rank 0's reports to --track's trackers carry the run's goodput (at most every 10 s), the earlier worker
    groups' part read from the run's record."""
    from raytrain.runtime.worker.reporter import Reporter

    record = [f"100.0 {format_event('metrics', step=1, wall_time=100.0, step_time_s=1.0)}",
              f"101.0 {format_event('metrics', step=2, wall_time=101.0, step_time_s=1.0)}",
              f"103.0 {format_event('restarting', attempt=2, time=103.0)}"]

    class Sink:
        def __init__(self):
            self.reports = []

        def report(self, metrics):
            self.reports.append(metrics)

    reporter = Reporter(rank=0, train_batch=4)
    reporter.trackers, reporter.goodput = Sink(), goodput.Feed(record)
    reporter.report({"step": 3, "wall_time": 111.0, "step_time_s": 1.0, "loss": 1.0})
    reporter.report({"step": 4, "wall_time": 112.0, "step_time_s": 1.0, "loss": 1.0})  # < 10 s later: none
    first, second = reporter.trackers.reports
    # 11 s since step 1: steps 2 and 3 (1 s each), 2 s lost before the restart, 7 s of restart
    assert first["goodput"] == pytest.approx(2 / 11, abs=1e-3) and "goodput" not in second


def test_each_saves_costs_reach_jobs_status_and_the_trackers_once():
    from raytrain import events, goodput
    from raytrain.events import JobFacts, checkpoint_timings, describe_checkpoint, format_event

    lines = [f"100.0 {format_event('checkpoint_stall', step=2, stall_s=0.11, time=100.0)}",
             f"101.0 {format_event('checkpoint', step=2, mode='async', snapshot_s=0.06, write_s=0.8, upload_s=6.1, wait_s=0.0)}",
             f"102.0 {format_event('checkpoint', step=4, mode='sync', stall_s=1.2)}"]
    facts = JobFacts.from_lines(lines)
    rows = checkpoint_timings(facts)
    assert rows == [{"step": 2, "mode": "async", "stall_s": 0.11, "snapshot_s": 0.06, "write_s": 0.8,
                     "upload_s": 6.1, "wait_s": 0.0},
                    {"step": 4, "mode": "sync", "stall_s": 1.2}]
    assert describe_checkpoint(rows[0]) == "step 2 (async): stall 0.11 s; snapshot 0.06 s, write 0.80 s, upload 6.10 s, wait 0.00 s"
    assert describe_checkpoint(rows[1]) == "step 4 (sync): stall 1.20 s"
    feed = goodput.Feed([])
    feed.add({"event": events.CHECKPOINT_STALL, "step": 2, "stall_s": 0.11})
    feed.add({"event": events.CHECKPOINT, "step": 2, "mode": "async", "snapshot_s": 0.06, "upload_s": 6.1})
    first = feed.update({"step": 3, "wall_time": 200.0, "step_time_s": 1.0})
    second = feed.update({"step": 4, "wall_time": 201.0, "step_time_s": 1.0})
    assert {k: first[k] for k in ("checkpoint/stall_s", "checkpoint/snapshot_s", "checkpoint/upload_s")} == \
        {"checkpoint/stall_s": 0.11, "checkpoint/snapshot_s": 0.06, "checkpoint/upload_s": 6.1}
    assert not any(k.startswith("checkpoint/") for k in second)  # once per save
