"""raytrain.timings: phases from every side reduced to one ordered timeline (issue 18)."""
import os
import time

from raytrain import timings
from raytrain.events import TIMING, JobFacts, format_event


def ev(phase, t, rank=None):
    e = {"event": TIMING, "phase": phase, "t": t}
    if rank is not None:
        e["rank"] = rank
    return e


def test_timeline_orders_phases_and_keeps_the_slowest_worker():
    events = [
        ev("first_step", 130.0, 0), ev("command", 100.0), ev("request_built", 100.5), ev("submitted", 101.0),
        ev("driver_started", 103.0), ev("driver_ready", 106.0), ev("workers_started", 115.0),
        ev("imports", 120.0, 0), ev("imports", 121.5, 1), ev("engine_built", 125.0, 0),
        ev("imports", 140.0, 1),  # the same phase again after a restart: the first run counts
        ev("no_such_phase", 99.0), {"event": TIMING, "phase": "preflight"},  # ignored
    ]
    rows = timings.timeline(events, job_accepted=101.2)
    assert [r.phase for r in rows] == ["command", "request_built", "submitted", "job_accepted", "driver_started",
                                      "driver_ready", "workers_started", "imports", "engine_built", "first_step"]
    by = {r.phase: r for r in rows}
    assert by["command"].at_s == 0 and by["first_step"].at_s == 30.0
    assert by["imports"].t == 121.5 and by["imports"].ranks == 2 and by["imports"].spread_s == 1.5
    assert by["workers_started"].took_s == 9.0 and by["imports"].took_s == 6.5
    assert by["job_accepted"].at_s == 1.2 and "Ray job" in by["job_accepted"].meaning


def test_overlapping_phases_add_no_time():
    rows = timings.timeline([ev("process_group", 10.0), ev("imports", 8.0, 0), ev("engine_built", 12.0, 0)])
    # imports finished before the process group formed: they overlapped, and add nothing
    assert [(r.phase, r.at_s, r.took_s) for r in rows] == [
        ("process_group", 2.0, 2.0), ("imports", 0.0, 0.0), ("engine_built", 4.0, 2.0)]


def test_client_marks_travel_to_the_driver_through_the_env(monkeypatch):
    monkeypatch.setattr(timings, "_client", {})
    timings.mark("command", 5.0)
    timings.mark("command", 6.0)  # the first mark wins
    timings.mark("submitted")
    env = timings.client_env()
    monkeypatch.setenv(timings.ENV, env[timings.ENV])
    got = timings.from_env()
    assert got["command"] == 5.0 and abs(got["submitted"] - time.time()) < 60
    monkeypatch.setenv(timings.ENV, "not json")
    assert timings.from_env() == {}


def test_events_reach_the_job_facts_and_the_table():
    facts = JobFacts.from_lines([format_event(TIMING, phase="command", t=1.0),
                                 "(RayTrainWorker pid=1) " + format_event(TIMING, phase="first_step", t=4.5, rank=0)])
    rows = timings.timeline(facts.timings)
    lines = timings.table(rows)
    assert lines[0].split()[:3] == ["phase", "at", "took"]
    assert lines[2].startswith("first_step") and "3.50s" in lines[2]


def test_process_start_time_is_this_process():
    start = timings.process_start_time()
    assert start is not None and start <= time.time() and time.time() - start < 3600
    assert abs(timings.process_start_time(os.getpid()) - start) < 0.05
    assert timings.process_start_time(2**30) is None


def test_process_start_time_is_exact_to_the_clock_tick():
    # /proc/stat's btime is whole seconds: a start computed from it was up to 1 s early, which the timings
    # table showed as time the command spent before its request was built
    import subprocess

    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    after = time.time()
    try:
        start = timings.process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before - 0.03 <= start <= after + 0.03, (before, start, after)


def test_a_phase_marked_now_carries_this_process_cpu_and_the_table_shows_it(monkeypatch, capsys):
    sum(i * i for i in range(200_000))  # some CPU in this process
    timings.emit("driver_ready")
    timings.emit("driver_started", 1.0)  # a time from elsewhere (the process start): no CPU figure
    lines = [l for l in capsys.readouterr().out.splitlines() if l.strip()]
    facts = JobFacts.from_lines(lines + [
        "(RayTrainWorker pid=1) " + format_event(TIMING, phase="imports", t=time.time(), rank=0, cpu=2.5),
        "(RayTrainWorker pid=2) " + format_event(TIMING, phase="imports", t=time.time(), rank=1, cpu=3.0),
    ])
    rows = {r.phase: r for r in timings.timeline(facts.timings)}
    assert 0 < rows["driver_ready"].cpu_s <= time.process_time() + 0.0005  # the event rounds to 1 ms
    assert rows["driver_started"].cpu_s is None
    assert rows["imports"].cpu_s == 3.0  # the most of any rank
    table = timings.table(list(rows.values()))
    assert table[0].split()[:4] == ["phase", "at", "took", "cpu"]
    assert any(l.startswith("imports") and "3.00s" in l for l in table)


def test_the_cores_each_rank_is_bound_to_reach_the_row_and_the_table():
    events = [dict(ev("imports", 10.0, 1), cores=[1]), dict(ev("imports", 9.5, 0), cores=[0]),
              dict(ev("imports", 30.0, 1), cores=[0]),  # a restart's: the first run counts
              ev("engine_built", 12.0, 0)]
    rows = timings.timeline(events)
    by = {r.phase: r for r in rows}
    assert by["imports"].cores == {0: [0], 1: [1]} and by["engine_built"].cores is None
    line = [x for x in timings.table(rows) if x.startswith("imports")][0]
    assert line.endswith("(2 workers, spread 0.50 s); training threads on cores 0 | 1"), line
    assert "cores" not in [x for x in timings.table(rows) if x.startswith("engine_built")][0]
