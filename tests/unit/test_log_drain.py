"""The driver holds its last word until every rank's last line is in the job's log (runtime.driver.log_drain)."""
import io
import threading
import time

import pytest

from raytrain import events
from raytrain.runtime.driver import log_drain


@pytest.fixture
def seen(monkeypatch):
    fresh = log_drain.Seen()
    monkeypatch.setattr(log_drain, "SEEN", fresh)
    return fresh


def test_log_ends_are_read_from_lines_written_in_pieces_and_prefixed_as_ray_forwards_them(seen):
    out = io.StringIO()
    watched = log_drain._Watched(out, seen)
    line = "(RayTrainWorker pid=7) " + events.format_event(events.LOG_END, rank=1, world_size=2)
    watched.write(line[:30])
    assert seen.ends == {}  # half a line is not an event yet
    watched.write(line[30:])
    watched.write("\n")
    assert seen.ends == {1: 2} and seen.missing() == [0]  # rank 0's says how many ranks there are
    watched.write(events.format_event(events.LOG_END, rank=0, world_size=2) + "\n")
    assert seen.missing() == [] and out.getvalue().count("log_end") == 2  # the stream got every byte


def test_an_earlier_group_size_does_not_count(seen):
    seen.ends = {0: 2, 1: 4}  # rank 1 of a group of 4 (before an elastic resize) is not rank 1 of 2
    assert seen.missing() == [1]


def test_wait_returns_when_the_last_rank_ends_and_names_what_never_came(seen, capsys):
    watched = log_drain._Watched(io.StringIO(), seen)
    watched.write(events.format_event(events.LOG_END, rank=0, world_size=2) + "\n")

    def late():
        time.sleep(0.5)
        watched.write("(pid=8) " + events.format_event(events.LOG_END, rank=1, world_size=2) + "\n")

    threading.Thread(target=late, daemon=True).start()
    t0 = time.monotonic()
    assert log_drain.wait(drain_s=10, quiet_s=5) == []
    assert 0.4 < time.monotonic() - t0 < 3 and capsys.readouterr().err == ""

    seen.ends = {0: 3, 1: 3}
    t0 = time.monotonic()
    assert log_drain.wait(drain_s=10, quiet_s=0.5) == [2]  # no line for 0.5 s: forwarding is over
    assert time.monotonic() - t0 < 3
    err = capsys.readouterr().err
    assert "rank(s) 2 did not reach the job's log (no line came for 0.5 s)" in err and "--rank N" in err


def test_lines_that_keep_coming_extend_the_wait_up_to_its_bound(seen, capsys):
    watched = log_drain._Watched(io.StringIO(), seen)
    stop = threading.Event()

    def chatter():
        while not stop.is_set():
            watched.write("(pid=9) still printing\n")
            time.sleep(0.05)

    threading.Thread(target=chatter, daemon=True).start()
    t0 = time.monotonic()
    try:
        assert log_drain.wait(drain_s=1.5, quiet_s=0.3) == [0]
    finally:
        stop.set()
    assert 1.4 < time.monotonic() - t0 < 4 and "within 1.5 s" in capsys.readouterr().err


def test_the_watched_stream_is_the_stream_to_its_users(seen, tmp_path):
    with open(tmp_path / "out", "w") as f:
        watched = log_drain._Watched(f, seen)
        assert watched.fileno() == f.fileno() and watched.encoding == f.encoding and watched.writable()
        assert watched.isatty() is False and watched.write("x\n") == 2


def _record(folder, who, timed_events):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"events-{who}.log", "a") as f:
        for t, kind, data in timed_events:
            f.write(f"{t:.6f} {events.format_event(kind, **data)}\n")


def test_a_ranks_events_the_log_never_got_are_copied_from_the_runs_record(seen, tmp_path, monkeypatch, capsys):
    # CI (tests/multinode/test_drain.py under load): the job succeeded, but rank 0's last checkpoint event never
    # reached the job's log, so the job's facts missed a committed checkpoint
    folder = tmp_path / "run" / "raytrain"
    now = seen.since + 1
    _record(folder, "rank-0", [(seen.since - 100, events.CHECKPOINT, {"step": 2}),  # an earlier driver's run
                               (now, events.METRICS, {"step": 9}), (now + 1, events.CHECKPOINT, {"step": 10}),
                               (now + 2, events.LOG_END, {"rank": 0, "world_size": 2})])
    _record(folder, "rank-1", [(now, events.LOG_END, {"rank": 1, "world_size": 2})])
    _record(folder, "driver", [(now, events.STARTED, {"name": "run"})])
    monkeypatch.setattr(events, "_record", str(folder / "events-driver.log"))
    watched = log_drain._Watched(io.StringIO(), seen)
    monkeypatch.setattr(log_drain.sys, "stdout", watched)
    watched.write("(RayTrainWorker pid=7) " + events.format_event(events.CHECKPOINT, step=2) + "\n")
    watched.write("(RayTrainWorker pid=7) " + events.format_event(events.METRICS, step=9) + "\n")
    watched.write("(RayTrainWorker pid=8) " + events.format_event(events.LOG_END, rank=1, world_size=2) + "\n")

    assert log_drain.wait(drain_s=5, quiet_s=0.2) == [0]
    out = watched._stream.getvalue().splitlines()
    copied = out[3:]
    assert [events.parse_line(line)["event"] for line in copied] == [events.CHECKPOINT, events.LOG_END], copied
    assert copied[0].startswith("(rank 0, from the run's record) @@raytrain ")
    facts = events.JobFacts.from_lines(out)
    assert facts.checkpoints == [2, 10] and [m["step"] for m in facts.metrics] == [9]  # nothing twice
    assert "2 of their events were copied here from the run's record" in capsys.readouterr().err


def test_every_ranks_record_is_read_and_nothing_seen_is_copied(seen, tmp_path, monkeypatch):
    folder = tmp_path / "raytrain"
    now = seen.since + 1
    _record(folder, "rank-0", [(now, events.CHECKPOINT, {"step": 4}), (now, events.LOG_END, {"rank": 0, "world_size": 2})])
    _record(folder, "rank-1", [(now, events.LOG_END, {"rank": 1, "world_size": 2})])
    watched = log_drain._Watched(io.StringIO(), seen)
    monkeypatch.setattr(log_drain.sys, "stdout", watched)
    watched.write("(pid=8) " + events.format_event(events.LOG_END, rank=1, world_size=2) + "\n")
    assert log_drain.replay(folder) == {0: 2}
    assert log_drain.replay(folder) == {}  # what it copied is in the log now
    assert log_drain.replay(None) == {} and log_drain.replay(tmp_path / "absent") == {}


def test_events_lost_mid_run_are_copied_in_the_job_facts_order(seen, tmp_path, monkeypatch, capsys):
    # CI (tests/e2e/test_preemption.py, two tests at a time): the rank that died for the restart committed a
    # checkpoint, whose event never reached the job's log though every rank's log_end did
    folder = tmp_path / "raytrain"
    now = seen.since + 1
    _record(folder, "rank-1", [(now, events.CHECKPOINT, {"step": 6}), (now + 1, events.METRICS, {"step": 7}),
                               (now + 2, events.LOG_END, {"rank": 1, "world_size": 2})])
    _record(folder, "rank-0", [(now + 3, events.CHECKPOINT, {"step": 10}),
                               (now + 4, events.LOG_END, {"rank": 0, "world_size": 2})])
    monkeypatch.setattr(events, "_record", str(folder / "events-driver.log"))
    watched = log_drain._Watched(io.StringIO(), seen)
    monkeypatch.setattr(log_drain.sys, "stdout", watched)
    for rank, kind, data in [(1, events.METRICS, {"step": 7}), (1, events.LOG_END, {"rank": 1, "world_size": 2}),
                             (0, events.CHECKPOINT, {"step": 10}), (0, events.LOG_END, {"rank": 0, "world_size": 2})]:
        watched.write(f"(RayTrainWorker pid={rank}) " + events.format_event(kind, **data) + "\n")

    assert log_drain.wait(drain_s=5, quiet_s=0.2) == []
    out = watched._stream.getvalue().splitlines()
    assert out[4:] == ["(rank 1, from the run's record) " + events.format_event(events.CHECKPOINT, step=6)], out
    facts = events.JobFacts.from_lines(out)
    assert facts.checkpoints == [6, 10] and [e["step"] for e in facts.checkpoint_events] == [6, 10]
    err = capsys.readouterr().err
    assert "1 event(s) of rank(s) 1 never reached the job's log" in err and "--rank N" in err


def test_record_lines_older_than_what_is_remembered_are_not_judged(tmp_path, monkeypatch):
    monkeypatch.setattr(log_drain, "RECENT", 3)
    seen = log_drain.Seen()
    monkeypatch.setattr(log_drain, "SEEN", seen)
    folder = tmp_path / "raytrain"
    watched = log_drain._Watched(io.StringIO(), seen)
    monkeypatch.setattr(log_drain.sys, "stdout", watched)
    lines = [(seen.since + 0.001 * (i + 1), events.METRICS, {"step": i}) for i in range(5)]
    _record(folder, "rank-0", lines)
    for t, kind, data in lines:  # each arrives after it was recorded; the first two are forgotten
        while time.time() <= t:
            time.sleep(0.001)
        watched.write(events.format_event(kind, **data) + "\n")
    assert seen.horizon >= lines[1][0]
    assert log_drain.replay(folder) == {}  # not the forgotten two copied again


def test_event_texts_split_joined_events_and_drop_rays_prefix():
    a, b = events.format_event(events.METRICS, step=1), events.format_event(events.STARTED, name="x")
    assert log_drain.event_texts(f"(RayTrainWorker pid=1, ip=10.0.0.2) {a}{b}  ") == [a, b]
    assert log_drain.event_texts("no event here") == []


def test_only_the_end_of_a_long_record_is_read(tmp_path):
    path = tmp_path / "events-rank-0.log"
    path.write_text("".join(f"{i} line-{i}\n" for i in range(100_000)))
    assert log_drain._tail_lines(path, 3) == ["99997 line-99997", "99998 line-99998", "99999 line-99999"]
    assert log_drain._tail_lines(path, 3, line_bytes=8) == ["99999 line-99999"]  # whole lines only
    short = tmp_path / "short.log"
    short.write_text("1 a\n2 b\n")
    assert log_drain._tail_lines(short, 10) == ["1 a", "2 b"]
