"""Per-rank logs kept in the run's storage (issue 17): `jobs logs ID --rank N | --node`, after the cluster is
gone; a failure names the rank and shows its last lines."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from raytrain import run_record
from raytrain.api import failing_rank_tail
from raytrain.cli.main import main
from raytrain.events import JobFacts, format_event
from raytrain.runtime.worker import rank_log
from raytrain.status import JobInfo, JobState

ROOT = Path(__file__).resolve().parents[2]


def record_rank(folder, rank, ip, lines, tmp=None):
    """A worker-like process (its fds 1 and 2 are files, as Ray's are) that starts the rank log and writes
    through print, os.write on fd 1 and 2 and a child process; it ends with os._exit (nothing flushed at
    exit). Returns what reached its original fds (Ray's log) once every line is in the rank's file."""
    script = (
        "import os, subprocess, sys\n"
        "from pathlib import Path\n"
        "from raytrain.runtime.worker import rank_log\n"
        "rank_log.start(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])\n"
        "for line in sys.argv[4:]:\n"
        "    print(line)\n"
        f"print({format_event('metrics', step=1)!r}, flush=True)\n"
        "os.write(1, b'fd 1 direct\\n')\n"
        "os.write(2, b'fd 2 direct\\n')\n"
        "subprocess.run(['sh', '-c', 'echo child out; echo child err >&2'])\n"
        "print('a traceback line', file=sys.stderr, flush=True)\n"
        "os.write(2, b'2026-12-03 13:08:13,328\\tINFO worker.py:1 -- Ray INFO chatter\\n')\n"
        "os.write(2, b'Reporting training result 1: TrainingReport(...)\\n')\n"
        "os._exit(3)\n"
    )
    log = folder / "logs" / f"rank-{rank}.log"
    marks = ("a traceback line", "child err", "child out", "fd 1 direct", "fd 2 direct")
    before = {m: log.read_text().count(m) if log.exists() else 0 for m in marks}
    out_dir = Path(tempfile.mkdtemp(dir=tmp))
    with open(out_dir / "out", "wb") as out, open(out_dir / "err", "wb") as err:
        proc = subprocess.run([sys.executable, "-c", script, str(folder), str(rank), ip, *lines],
                              stdout=out, stderr=err, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 3
    deadline = time.monotonic() + 20  # the tee processes drain the pipes, the copier copies, on their own
    while not (log.exists() and all(log.read_text().count(m) > before[m] for m in marks)):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.05)
    return (out_dir / "out").read_text(), (out_dir / "err").read_text()


def test_rank_logs_capture_fd_1_and_2_of_the_process_and_its_children(tmp_path):
    folder = tmp_path / "run-1" / "raytrain"
    out, err = record_rank(folder, 0, "10.0.0.1", ["printed by python"], tmp_path)
    text = (folder / "logs" / "rank-0.log").read_text()
    assert text.startswith("# raytrain rank 0 on ") and "(10.0.0.1)" in text.splitlines()[0]
    for line in ("printed by python", "fd 1 direct", "fd 2 direct", "child out", "child err", "a traceback line"):
        assert line in text
    # Ray's own log (the fds as they were) still gets everything, each stream on its own fd
    assert "printed by python" in out and "fd 1 direct" in out and "child out" in out and "fd 2 direct" not in out
    assert "fd 2 direct" in err and "child err" in err and "a traceback line" in err and "child out" not in err


def test_rank_logs_by_rank_and_node_without_a_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    folder = tmp_path / "runs" / "run-1" / "raytrain"
    out, _ = record_rank(folder, 0, "10.0.0.1", ["rank zero says hi"], tmp_path)
    record_rank(folder, 1, "10.0.0.2", ["rank one says hi"], tmp_path)
    record_rank(folder, 1, "10.0.0.3", ["rank one again, after a restart"], tmp_path)
    assert "rank zero says hi" in out  # Ray still gets everything
    (folder / "events-driver.log").write_text("1.0 " + format_event("started") + "\n")
    runner = CliRunner()
    base = ["jobs", "logs", "run-1", "--storage", str(tmp_path / "runs")]
    out = runner.invoke(main, [*base, "--rank", "1"])
    assert out.exit_code == 0, out.output
    assert "rank one says hi" in out.output and "after a restart" in out.output and "rank zero" not in out.output
    assert "a traceback line" in out.output and "@@raytrain" not in out.output
    assert "Ray INFO chatter" not in out.output and "Reporting training result" not in out.output  # as on the terminal
    assert "@@raytrain" in runner.invoke(main, [*base, "--rank", "1", "-v"]).output
    by_node = runner.invoke(main, [*base, "--node", "10.0.0.1"]).output
    assert "rank zero says hi" in by_node and "rank one" not in by_node
    both = runner.invoke(main, [*base, "--rank", "0", "--rank", "1"]).output
    assert "(rank 0) rank zero says hi" in both and "(rank 1) rank one says hi" in both
    missing = runner.invoke(main, [*base, "--rank", "7"])
    assert missing.exit_code == 2 and "no rank(s) 7; the run has rank(s) 0, 1" in missing.output


def test_a_failure_shows_the_failing_ranks_last_lines(tmp_path):
    folder = tmp_path / "run-1" / "raytrain"
    record_rank(folder, 1, "10.0.0.2", [f"line {i}" for i in range(30)] + ["ValueError: bad shard"], tmp_path)
    facts = JobFacts(error={"event": "error", "rank": 1, "type": "ValueError", "message": "bad shard"})
    info = JobInfo(job_id="run-1", name="x", state=JobState.FAILED, target="local", address="", facts=facts)
    text = failing_rank_tail(info, str(tmp_path))
    assert "last lines of rank 1 (all: raytrain jobs logs run-1 --rank 1):" in text
    assert "  ValueError: bad shard" in text and "line 29" in text and "line 10" not in text
    assert "Ray INFO chatter" not in text and "Reporting training result" not in text
    assert failing_rank_tail(info, None) == ""


def test_lines_a_follow_already_showed_are_not_shown_again(tmp_path):
    from raytrain.cli.progress import RecentLines

    folder = tmp_path / "run-1" / "raytrain"
    lines = ["early line", "Traceback (most recent call last):", '  File "job.py", line 3, in train',
             "ValueError: bad shard"]
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "rank-1.log").write_text(rank_log.header(1, "h", "10.0.0.2") + "\n".join(lines) + "\n")
    facts = JobFacts(error={"event": "error", "rank": 1, "type": "ValueError", "message": "bad shard"})
    info = JobInfo(job_id="run-1", name="x", state=JobState.FAILED, target="local", address="", facts=facts)

    def followed(size, printed):
        shown = RecentLines(size=size)
        for line in printed:  # as the terminal printed them: Ray's prefix, colour codes
            shown.add(f"\x1b[36m(RayTrainWorker pid=7, ip=10.0.0.2)\x1b[0m {line}")
        return shown

    pointer = "\n(its output is above; all of rank 1's: raytrain jobs logs run-1 --rank 1)"
    assert failing_rank_tail(info, str(tmp_path), shown=followed(500, lines)) == pointer
    assert "last lines of rank 1" in failing_rank_tail(info, str(tmp_path), shown=followed(500, lines[:-1]))
    evicted = followed(3, lines)  # only the last 3 printed lines are kept
    assert "early line" not in evicted and "ValueError: bad shard" in evicted
    assert "last lines of rank 1" in failing_rank_tail(info, str(tmp_path), shown=evicted)
    assert "last lines of rank 1" in failing_rank_tail(info, str(tmp_path), shown=RecentLines())  # submit -q


def test_a_failure_shows_the_traceback_the_worker_sent_while_its_log_copy_is_behind(tmp_path):
    """The rank's log reaches the storage through a copier of its own (raytrain.runtime.worker.rank_log_copy), which
    may not have copied the error yet when the failure is reported: the traceback the worker sent with its
    failure (the error event's ``traceback``) is shown instead, once."""
    from raytrain.cli.progress import RecentLines

    folder = tmp_path / "run-1" / "raytrain"
    sent = 'Traceback (most recent call last):\n  File "job.py", line 3, in train\nValueError: bad shard\n'
    facts = JobFacts(error={"event": "error", "rank": 1, "type": "ValueError", "message": "bad shard",
                            "traceback": sent})
    info = JobInfo(job_id="run-1", name="x", state=JobState.FAILED, target="local", address="", facts=facts)
    header = "rank 1's traceback (all of its output, once its log has reached the storage: raytrain jobs logs run-1 --rank 1):"
    # no copy at all yet, then a copy that stops before the error
    for copied in (None, "early line\n"):
        if copied is not None:
            (folder / "logs").mkdir(parents=True)
            (folder / "logs" / "rank-1.log").write_text(rank_log.header(1, "h", "10.0.0.2") + copied)
        text = failing_rank_tail(info, str(tmp_path), shown=RecentLines())
        assert text == "\n" + header + "\n" + "\n".join(f"  {line}" for line in sent.splitlines()), text
    followed = RecentLines()
    for line in sent.splitlines():
        followed.add(f"(RayTrainWorker pid=7, ip=10.0.0.2) {line}")
    assert failing_rank_tail(info, str(tmp_path), shown=followed) == (
        "\n(its output is above; all of rank 1's: raytrain jobs logs run-1 --rank 1)")
    # once the copy has the error, its last lines as before
    (folder / "logs" / "rank-1.log").write_text(rank_log.header(1, "h", "10.0.0.2") + "early line\n" + sent)
    assert "last lines of rank 1 (all: raytrain jobs logs run-1 --rank 1):\n  early line" in failing_rank_tail(
        info, str(tmp_path), shown=RecentLines())


def test_a_workers_failure_carries_its_job_traceback_through_pickling(capsys):
    """What the worker prints is what travels with the exception (Ray Train pickles it to the driver), found
    from the exception or one that it caused."""
    import pickle

    from raytrain.runtime.worker import errors as worker_errors

    def job_code():
        raise ValueError("bad shard")

    try:
        job_code()
    except ValueError as exc:
        worker_errors.print_failure(exc)
        caught = exc
    printed = capsys.readouterr().err
    assert printed.startswith("Traceback (most recent call last):") and printed.endswith("ValueError: bad shard\n")
    assert "in job_code" in printed
    back = pickle.loads(pickle.dumps(caught))
    assert worker_errors.shipped_traceback(back) == printed
    wrapper = RuntimeError("wrapped")
    wrapper.__cause__ = back
    assert worker_errors.shipped_traceback(wrapper) == printed
    assert worker_errors.shipped_traceback(ValueError("never printed")) is None


def test_without_tee_python_level_writes_are_copied(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rank_log.shutil, "which", lambda name: None)
    saved = sys.stdout, sys.stderr
    try:
        path = rank_log.start(tmp_path, 0, "10.0.0.1")
        print("a python line")
        print("an error line", file=sys.stderr)
    finally:
        sys.stdout.copy.close()
        sys.stdout, sys.stderr = saved
    assert not rank_log._captured  # no fd was touched
    deadline = time.monotonic() + 20  # copied to the storage within a second or so
    while not (path.exists() and "an error line" in path.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    text = path.read_text()
    assert text.startswith("# raytrain rank 0 on ") and "a python line" in text and "an error line" in text
    assert "a python line" in capsys.readouterr().out  # Ray still gets everything


def test_a_storage_that_blocks_never_blocks_the_workers_prints(tmp_path):
    """The rank's log in the storage is a FIFO nobody reads: opening it for writing blocks for ever, as a
    hung network file system does. The worker prints on and exits at once (before: it hung in its first write
    to the storage); the copy says it stalled, then gives up after its final bound (2 s here, 60 s by default)
    with a rank_log event and a line in Ray's log of the worker, and the log stays on the node's disk."""
    import json

    from raytrain import events

    folder = tmp_path / "run-1" / "raytrain"
    (folder / "logs").mkdir(parents=True)
    os.mkfifo(folder / "logs" / "rank-0.log")
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from raytrain.runtime.worker import rank_log\n"
        "rank_log.COPY_EVERY_S, rank_log.COPY_STALL_S, rank_log.FINAL_COPY_S = 0.2, 1.0, 2.0\n"
        "start = time.monotonic()\n"
        "rank_log.start(Path(sys.argv[1]), 0, '10.0.0.1')\n"
        "for i in range(100):\n"
        "    print(f'step {i}', flush=True)\n"
        "print(f'printed in {time.monotonic() - start:.2f} s', flush=True)\n"
        "time.sleep(2.5)\n"  # long enough for the copy to be seen stalled
        "print('last line', flush=True)\n"
        "os._exit(0)\n"
    )
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", script, str(folder)], stdout=out, stderr=err,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 0 and time.monotonic() - start < 20
    deadline = time.monotonic() + 30
    while '"state":"copy_failed"' not in out_path.read_text():
        assert time.monotonic() < deadline, (out_path.read_text()[-2000:], err_path.read_text()[-2000:])
        time.sleep(0.1)
    out, err = out_path.read_text(), err_path.read_text()
    printed = float(out.split("printed in ")[1].split(" s")[0])
    assert printed < 2.0 and "step 99" in out and "last line" in out  # Ray's log got every line at once
    said = [e for e in map(events.parse_line, out.splitlines()) if e and e["event"] == events.RANK_LOG]
    assert [e["state"] for e in said] == ["stalled", "copy_failed"], said
    failed = said[-1]
    assert failed["rank"] == 0 and failed["log"] == str(folder / "logs" / "rank-0.log")
    assert "did not take the last lines within 2 s" in failed["reason"]
    assert f"raytrain: rank 0's log could not be copied to {folder / 'logs' / 'rank-0.log'}" in err
    local = Path(failed["local"])
    assert local.is_file() and "last line" in local.read_text() and "step 0" in local.read_text()
    assert local.stat().st_mode & 0o077 == 0  # private on the node
    local.unlink()
    assert json.dumps(failed)  # one event, one line: what `jobs status` warns about
    facts = JobFacts.from_lines(out.splitlines())
    assert any("rank 0's log could not be copied" in w for w in facts.warnings()), facts.warnings()


def test_a_rank_that_only_lost_a_peer_says_so_in_one_line_and_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    from raytrain.runtime.worker import errors as worker_errors

    monkeypatch.setattr(rank_log.shutil, "which", lambda name: None)
    monkeypatch.setattr(rank_log, "_local", None)
    saved = sys.stdout, sys.stderr
    try:
        path = rank_log.start(tmp_path, 0, "10.0.0.1")
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:14743: Connection reset by "
                               "peer. This is typically caused by a remote worker hanging")
        except RuntimeError as exc:
            worker_errors.print_failure(exc, rank=0)
            lost = exc
        try:
            raise ValueError("bad shard")
        except ValueError as exc:
            worker_errors.print_failure(exc, rank=0)
    finally:
        sys.stdout.copy.close()
        sys.stdout, sys.stderr = saved
    printed = capsys.readouterr().err
    assert printed.count("Traceback (most recent call last)") == 1 and "ValueError: bad shard" in printed  # the cause
    assert ("raytrain: rank 0 stopped: a peer left the collective it was in (RuntimeError: ... Connection reset by "
            "peer); its traceback is in its log (`raytrain jobs logs JOB --rank 0`)\n") in printed
    own = rank_log._local.read_text()
    assert "RuntimeError: [gloo/transport/tcp/pair.cc:537]" in own and own.count("Traceback") == 2
    assert "Connection reset by peer" in worker_errors.shipped_traceback(lost)  # the driver still gets it all
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text().count("Traceback") == 2):  # and the storage's copy
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_rays_paragraph_for_a_dead_process_reads_as_one_line():
    from raytrain.runtime.driver.entrypoint import _restart_reason

    died = RuntimeError(
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes "
        "include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop --force")
    assert _restart_reason(died, 1) == ("rank 1: its worker process died (SYSTEM_ERROR: Worker unexpectedly exits "
                                        "with a connection error code 2. End of file.)")
    assert _restart_reason(ValueError("line 1\nbad shard"), 0) == "rank 0: ValueError: bad shard"


def test_the_copier_outlives_a_worker_that_ends_at_once_and_whose_children_ray_kills(tmp_path):
    """Ray's core worker SIGKILLs its direct child processes as it exits (RAY_kill_child_processes_on_worker_exit,
    on by default). A run shorter than the copier's start-up (one step, a loaded node) lost its whole rank log that
    way: the copier had not forked away yet. Here the worker ends the moment its line is in the local file."""
    folder = tmp_path / "run-1" / "raytrain"
    script = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "from raytrain.runtime.worker import rank_log\n"
        "rank_log.start(Path(sys.argv[1]), 0, '10.0.0.1')\n"
        "print('the only line', flush=True)\n"
        "deadline = time.monotonic() + 20\n"
        "while b'the only line' not in rank_log._local.read_bytes():\n"  # the tee has written it
        "    assert time.monotonic() < deadline\n"
        "    time.sleep(0.01)\n"
        "me = str(os.getpid())\n"
        "for pid in os.listdir('/proc'):\n"  # what Ray does on a worker's exit: every direct child, SIGKILL
        "    try:\n"
        "        stat = open(f'/proc/{pid}/stat').read()\n"
        "    except (OSError, ValueError):\n"
        "        continue\n"
        "    if pid.isdigit() and stat.rsplit(')', 1)[1].split()[1] == me:\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"
        "os._exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(folder)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = folder / "logs" / "rank-0.log"
    deadline = time.monotonic() + 20
    while not (log.exists() and "the only line" in log.read_text()):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no copy of the rank's log"
        time.sleep(0.05)
