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
