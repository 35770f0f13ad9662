"""Event lines as a job's log holds them: Ray's driver prints a forwarded worker line and its newline as two
writes, so an event the driver writes from another thread can land between them, on the worker's line."""
import subprocess
import sys

from raytrain import events
from raytrain.run_metrics import from_lines

JOINED = ('(RayTrainWorker pid=4242) ' + events.format_event(events.METRICS, step=5, loss=1.5)
          + events.format_event(events.STRAGGLER, rank=1, message="rank 1 is slow"))


def test_two_events_on_one_line_are_both_read():
    assert [e["event"] for e in events.parse_events(JOINED)] == [events.METRICS, events.STRAGGLER]
    facts = events.JobFacts.from_lines([JOINED])
    assert [m["step"] for m in facts.metrics] == [5]
    assert from_lines("job", [JOINED]).steps[0]["step"] == 5


def test_a_broken_event_does_not_hide_the_next_one():
    line = events.MARKER + '{"event": "metrics", "step": ' + events.format_event(events.METRICS, step=6)
    assert [e["step"] for e in events.parse_events(line)] == [6]
    assert events.parse_events("no event here") == [] and events.parse_line("no event here") is None


WRITERS = r'''
import sys, threading
from ray._private import worker
from raytrain import events

def forwarded():  # Ray's own printing of forwarded worker lines, as the driver's log thread does it
    for step in range(1, 3001):
        worker.print_worker_logs({"pid": 4242, "ip": "10.0.0.1", "localhost": "10.0.0.1", "actor_name": "RayTrainWorker",
                                  "lines": [events.format_event(events.METRICS, step=step)]}, sys.stdout)

def driver():  # the driver's own events, from another thread
    for n in range(3000):
        events.emit(events.STRAGGLER, n=n)

threads = [threading.Thread(target=forwarded), threading.Thread(target=driver)]
[t.start() for t in threads]
[t.join() for t in threads]
'''


def test_no_event_is_lost_when_the_driver_writes_between_a_forwarded_line_and_its_newline(tmp_path):
    out = tmp_path / "job.log"
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", WRITERS], stdout=f, check=True, timeout=120,
                       env={"PYTHONUNBUFFERED": "1", "RAY_COLOR_PREFIX": "0", "PATH": "/usr/bin:/bin",
                            "PYTHONPATH": ":".join(sys.path)})
    lines = out.read_text().splitlines()
    facts = events.JobFacts.from_lines(lines)
    assert [m["step"] for m in facts.metrics] == list(range(1, 3001))
    assert sum(1 for line in lines for e in events.parse_events(line) if e["event"] == events.STRAGGLER) == 3000
