"""--track (issue 17): rank 0's trackers through their real libraries, one tracker run per raytrain run; a
restart (a new Trackers on the same run record) appends at the right step and never logs a step twice."""
import importlib
import json
import os
from pathlib import Path

import pytest

from raytrain.config.plan import Plan, Scaling
from raytrain.runtime.tracking import trackers


def plan(storage, track, **kw):
    return Plan(
        name="gpt", job_file="/j/gpt.py", job_dir="/j", job_module="gpt.py", job_args=[],
        deepspeed={"train_batch_size": 8, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}},
        scaling=Scaling(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        parallel={"dp": 2, "tp": 1, "pp": 1}, train_batch=8, precision="bf16", zero=3, offload="none",
        storage=str(storage), track=track, **kw,
    )


def run_attempt(p, steps, run="run-1"):
    t = trackers.start(p, rank=0, run_name=run, log=print)
    for step in steps:
        t.report({"step": step, "loss": 5.0 - 0.1 * step, "samples_per_s": 10.0, "wall_time": 1.0})
    return t


def scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    # By step: the accumulator reads an attempt's event files in name order, and a writer's name ends in a
    # per-process counter (".9" sorts after ".10"), so a second attempt in the same process can come first
    return sorted(((e.step, round(e.value, 4)) for e in acc.Scalars(tag)), key=lambda sv: sv[0])


def test_tensorboard_and_mlflow_one_run_one_value_per_step_across_a_restart(tmp_path):
    p = plan(tmp_path, ["tensorboard", "mlflow"])
    assert trackers.start(p, rank=1, run_name="run-1") is None  # rank 0 only
    first = run_attempt(p, range(1, 6))
    first.flush(timeout_s=30)  # killed: no finish; the queue is drained though
    # the restart resumes from the checkpoint of step 3: steps 4, 5 come again, then 6..8
    second = run_attempt(p, range(4, 9))
    second.finish({"steps": 8, "final_loss": 4.2})
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    assert state["tensorboard"]["last_step"] == 8 and state["mlflow"]["last_step"] == 8

    loss = scalars(tmp_path / "run-1" / "tensorboard", "loss")
    assert [s for s, _ in loss] == list(range(1, 9)), loss
    assert dict(loss)[5] == 4.5

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=state["mlflow"]["uri"])
    exp = client.get_experiment_by_name("gpt")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "run-1" and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 9))
    params = runs[0].data.params
    assert params["deepspeed.zero_optimization.stage"] == "3" and params["raytrain.precision"] == "bf16"
    assert params["raytrain.scaling.num_workers"] == "2"
    assert runs[0].data.tags["summary.final_loss"] == "4.2"


def test_wandb_offline_one_run_resumed(tmp_path, monkeypatch):
    importlib.import_module("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    p = plan(tmp_path, ["wandb"])
    t = run_attempt(p, range(1, 4))
    t.finish({"steps": 3})
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    run_id = state["wandb"]["id"]
    assert state["wandb"]["last_step"] == 3
    t2 = run_attempt(p, range(2, 6))
    t2.finish({"steps": 5})
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    assert state["wandb"]["id"] == run_id and state["wandb"]["last_step"] == 5
    offline = list((tmp_path / "run-1" / "wandb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline, list((tmp_path / "run-1" / "wandb").rglob("*"))[:20]


def test_a_missing_tracker_library_is_one_line_and_training_goes_on(tmp_path, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_mlflow(name, *a, **kw):
        if name.startswith("mlflow"):
            raise ImportError("No module named 'mlflow'", name="mlflow")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    t = run_attempt(plan(tmp_path, ["mlflow"]), range(1, 3))
    t.finish({})
    out = capsys.readouterr().out
    assert "--track mlflow: mlflow is not installed on the cluster (pip install 'raytrain[track]')" in out
    assert '"event":"tracker","name":"mlflow","state":"dropped"' in out


def test_params_are_the_flags_and_the_exact_deepspeed_config(tmp_path):
    params = trackers.plan_params(plan(tmp_path, ["mlflow"]))
    assert params["deepspeed.bf16.enabled"] is True and params["deepspeed.train_batch_size"] == 8
    assert params["raytrain.track"] == '["mlflow"]' and params["raytrain.zero"] == 3


def test_flush_waits_until_every_queued_step_is_logged(tmp_path):
    t = run_attempt(plan(tmp_path, ["tensorboard"]), range(1, 30))
    t.flush(timeout_s=60)
    assert t.pending() == 0
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    assert state["tensorboard"]["last_step"] == 29
    t.finish({})


def mlflow_runs(p, run="run-1"):
    from mlflow.tracking import MlflowClient

    state = json.loads((Path(p.storage) / run / "raytrain" / "trackers.json").read_text())
    client = MlflowClient(tracking_uri=state["mlflow"]["uri"])
    runs = client.search_runs([client.get_experiment_by_name("gpt").experiment_id])
    return [r for r in runs if r.info.run_name == run], client


def test_a_failed_run_ends_its_mlflow_run_failed_and_a_resume_appends_to_it(tmp_path):
    p = plan(tmp_path, ["tensorboard", "mlflow"])
    record = tmp_path / "run-1" / "raytrain"
    run_attempt(p, range(1, 4)).flush()  # killed, restarted by Ray Train from step 2: still running
    (only,), _ = mlflow_runs(p)
    assert only.info.status == "RUNNING"
    run_attempt(p, range(3, 6)).flush()  # killed again, no restart left: the driver ends the run
    assert trackers.end_runs(p, record, "failed", run_name="run-1") == ["mlflow"]  # TensorBoard has no status
    (only,), client = mlflow_runs(p)
    assert only.info.status == "FAILED"
    t = run_attempt(p, range(6, 8))  # --resume of the failed run: the same tracker run, running again
    t.flush()
    assert mlflow_runs(p)[0][0].info.status == "RUNNING"
    t.finish({"steps": 7})
    (only,), client = mlflow_runs(p)
    assert only.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(only.info.run_id, "loss")) == list(range(1, 8))

    run_attempt(p, [1, 2], run="run-2").flush()  # `jobs stop`: KILLED
    assert trackers.end_runs(p, tmp_path / "run-2" / "raytrain", "stopped", run_name="run-2") == ["mlflow"]
    assert mlflow_runs(p, "run-2")[0][0].info.status == "KILLED"
    assert trackers.end_runs(p, tmp_path / "run-3" / "raytrain", "failed") == []  # rank 0 never started


def stop_driver(p, tmp_path, warm_mlflow: bool) -> str:
    """A driver process (record_when_stopped, its events recorded in the run's folder) SIGTERMed as `jobs stop`
    does: it exits by the signal; what it printed (its events).

    The handshake is a file the process writes once the handler is installed (and MLflow's client is ready),
    not a line on stdout: a SIGTERM that lands while the process is still inside that line's write would have
    the handler write to stdout in the middle of a write to it (a buffered stream is not reentrant)."""
    import signal
    import subprocess
    import sys
    import time

    ready = tmp_path / "driver-ready"
    script = (
        "import json, sys, time\n"
        "from raytrain.config.plan import Plan\n"
        "from pathlib import Path\n"
        "from raytrain import run_record\n"
        "from raytrain.runtime.driver import entrypoint as driver; from raytrain.runtime.tracking import trackers\n"
        "plan = Plan.from_dict(json.loads(sys.argv[1]))\n"
        "run_record.start(plan.storage, 'run-1', 'driver')\n"
        "driver.record_when_stopped(plan, 'run-1')\n"
        + ("assert trackers.warm_up(Path(sys.argv[2]), timeout_s=120)\n" if warm_mlflow else "")
        # (as the driver's thread does: a stop comes later)
        + "Path(sys.argv[3]).write_text('ready')\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(p.to_dict()), str(tmp_path / "run-1" / "raytrain"),
                             str(ready)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        deadline = time.monotonic() + 240  # imports (and MLflow's client) on a loaded machine
        while not (ready.exists() and ready.read_text() == "ready"):
            assert proc.poll() is None, f"the driver exited {proc.returncode} before its handler was installed"
            assert time.monotonic() < deadline, "the driver did not install its SIGTERM handler within 240 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        return proc.stdout.read()
    finally:
        proc.kill()


def test_a_stopped_driver_ends_the_mlflow_run_killed_then_exits_on_sigterm(tmp_path):
    p = plan(tmp_path, ["mlflow"])
    run_attempt(p, [1, 2]).flush()
    stop_driver(p, tmp_path, warm_mlflow=True)
    assert mlflow_runs(p)[0][0].info.status == "KILLED"


def test_a_stopped_driver_says_so_in_its_log_and_the_runs_record(tmp_path):
    """Without trackers too: the `stopped` event is the driver's last word, so the run's record says how the
    job ended after its cluster is gone (`jobs status` reads it then)."""
    from raytrain import events, run_record

    p = plan(tmp_path, [])
    out = stop_driver(p, tmp_path, warm_mlflow=False)
    assert [e["event"] for e in map(events.parse_line, out.splitlines()) if e] == ["stopped"]
    facts = events.JobFacts.from_lines(run_record.read_lines(tmp_path / "run-1" / "raytrain"))
    assert facts.stopped == {"event": "stopped", "signal": "SIGTERM"}
    assert facts.finished is None and facts.error is None


def test_a_stop_that_lands_in_the_middle_of_a_write_to_stdout_still_records_it(tmp_path):
    """The SIGTERM handler runs in the main thread, which may be inside a write to stdout (a buffered stream is
    not reentrant: the handler's own write raises): the `stopped` event still reaches the run's record and
    the job's log (straight to fd 1). Here the write itself sends the signal, so the handler runs inside it."""
    import signal
    import subprocess
    import sys

    from raytrain import events, run_record

    p = plan(tmp_path, [])
    script = (
        "import io, json, os, signal, sys, time\n"
        "from raytrain.config.plan import Plan\n"
        "from raytrain import run_record\n"
        "from raytrain.runtime.driver import entrypoint as driver\n"
        "plan = Plan.from_dict(json.loads(sys.argv[1]))\n"
        "run_record.start(plan.storage, 'run-1', 'driver')\n"
        "driver.record_when_stopped(plan, 'run-1')\n"
        "class Raw(io.RawIOBase):\n"
        "    def writable(self):\n"
        "        return True\n"
        "    def write(self, b):\n"
        "        if b'mid-write' in bytes(b):\n"
        "            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, inside the buffered write\n"
        "        return os.write(1, b)\n"
        "sys.stdout = io.TextIOWrapper(io.BufferedWriter(Raw()))\n"
        "print('mid-write', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(p.to_dict())], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert [e["event"] for e in map(events.parse_line, proc.stdout.splitlines()) if e] == ["stopped"], proc.stdout
    facts = events.JobFacts.from_lines(run_record.read_lines(tmp_path / "run-1" / "raytrain"))
    assert facts.stopped == {"event": "stopped", "signal": "SIGTERM"}


def test_a_failed_run_finishes_its_wandb_run_with_exit_code_1(tmp_path, monkeypatch):
    importlib.import_module("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import subprocess
    import sys

    p = plan(tmp_path, ["wandb"])
    worker = (  # rank 0's process: logs two steps and dies (its W&B run never finished)
        "import json, os, sys\n"
        "from raytrain.config.plan import Plan\n"
        "from raytrain.runtime.tracking import trackers\n"
        "t = trackers.start(Plan.from_dict(json.loads(sys.argv[1])), rank=0, run_name='run-1')\n"
        "t.report({'step': 1, 'loss': 2.0}); t.report({'step': 2, 'loss': 1.0}); t.flush()\n"
        "os._exit(1)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # its own W&B service, as a worker has
    subprocess.run([sys.executable, "-c", worker, json.dumps(p.to_dict())], timeout=120,
                   env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    driver = (  # the driver's process ends the run (in this test process an earlier test's W&B service and
        # wandb's module state would take the call, which no driver has)
        "import json, sys\n"
        "from pathlib import Path\n"
        "from raytrain.config.plan import Plan\n"
        "from raytrain.runtime.tracking import trackers\n"
        "ended = trackers.end_runs(Plan.from_dict(json.loads(sys.argv[1])), Path(sys.argv[2]), 'failed', "
        "run_name='run-1')\n"
        "print('ENDED', json.dumps(ended), flush=True)\n"
    )
    record = str(tmp_path / "run-1" / "raytrain")
    out = subprocess.run([sys.executable, "-c", driver, json.dumps(p.to_dict()), record], timeout=180,
                         capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert 'ENDED ["wandb"]' in out.stdout, (out.stdout[-2000:], out.stderr[-2000:])
    # the same W&B run (its id), finished by the driver with exit code 1 (W&B's own log of finish())
    logs = list((tmp_path / "run-1" / "wandb").rglob(f"*-{state['wandb']['id']}/logs/debug.log"))
    assert any("got exitcode: 1" in path.read_text() for path in logs), [(f, f.read_text()[-2000:]) for f in logs]


def test_a_step_mlflow_took_just_before_the_worker_died_is_not_logged_again(tmp_path):
    p = plan(tmp_path, ["mlflow"])
    run_attempt(p, range(1, 4)).flush()
    (only,), client = mlflow_runs(p)
    from mlflow.entities import Metric

    # the worker died after the store took step 4 and before trackers.json said so
    client.log_batch(only.info.run_id, metrics=[Metric("loss", 4.6, 0, 4)])
    state_file = tmp_path / "run-1" / "raytrain" / "trackers.json"
    assert json.loads(state_file.read_text())["mlflow"]["last_step"] == 3
    t = run_attempt(p, range(3, 7))  # the restart redoes steps 3.. from its checkpoint
    t.finish({"steps": 6})
    steps = [m.step for m in client.get_metric_history(only.info.run_id, "loss")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6], steps


def test_a_step_tensorboard_took_just_before_the_worker_died_is_not_logged_again(tmp_path):
    # CI saw it: rank 0 was killed after the event file took step 6 and before trackers.json said so, and the
    # restart (redoing steps 5-6 from the step-4 checkpoint) wrote step 6 a second time
    p = plan(tmp_path, ["tensorboard"])
    run_attempt(p, range(1, 7)).flush()
    state_file = tmp_path / "run-1" / "raytrain" / "trackers.json"
    state = json.loads(state_file.read_text())
    assert state["tensorboard"]["last_step"] == 6
    state["tensorboard"]["last_step"] = 5  # the kill window: the event file holds step 6, the state says 5
    state_file.write_text(json.dumps(state))
    t = run_attempt(p, range(5, 11))
    t.finish({"steps": 10})
    loss = scalars(tmp_path / "run-1" / "tensorboard", "loss")
    assert [s for s, _ in loss] == list(range(1, 11)), loss
    assert trackers.TensorBoard.last_logged_step(tmp_path / "run-1" / "tensorboard") == 10
    assert trackers.TensorBoard.last_logged_step(tmp_path / "nothing-here") == 0


class Blackhole:
    """A TCP server that accepts connections and never answers (an MLflow server hung, or a firewall that
    drops the replies)."""

    def __init__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # the kernel completes the handshakes; nobody reads or answers
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


def closed_port_uri():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def train_steps(t, steps, checkpoint_every=3):
    """What rank 0's training thread does: a report per step, a flush before every checkpoint. Returns the
    longest a step spent in raytrain's tracker calls."""
    import time

    longest = 0.0
    for step in steps:
        start = time.monotonic()
        t.report({"step": step, "loss": 1.0 / step})
        if step % checkpoint_every == 0:
            t.flush()
        longest = max(longest, time.monotonic() - start)
    return longest


def dropped_events(out):
    from raytrain import events

    return [e for e in map(events.parse_line, out.splitlines()) if e and e["event"] == "tracker"]


def test_an_unreachable_mlflow_server_is_dropped_within_seconds_and_training_goes_on(tmp_path, capsys):
    """A closed port: the first step does not wait for the tracker's start, and MLflow's retries (7, minutes
    by default) are bounded: the tracker is reported dead within 30 s; later checkpoints do not wait for it."""
    import time

    p = plan(tmp_path, ["tensorboard", "mlflow"], mlflow_uri=closed_port_uri())
    start = time.monotonic()
    t = trackers.start(p, rank=0, run_name="run-1")
    assert time.monotonic() - start < 1.0  # the start is off the training thread
    train_steps(t, range(1, 3))
    deadline = time.monotonic() + 30
    while not any(s.dead for s in t.slots) and time.monotonic() < deadline:
        time.sleep(0.1)
    took = time.monotonic() - start
    assert [s.name for s in t.slots if s.dead] == ["mlflow"], [(s.name, s.dead) for s in t.slots]
    assert took < 30, took
    assert train_steps(t, range(3, 13)) < 5.0  # checkpoints wait only for the tracker still alive
    t.finish({"steps": 12})
    out = capsys.readouterr().out
    (event,) = dropped_events(out)
    assert event["name"] == "mlflow" and event["state"] == "dropped"
    assert "cannot start" in event["reason"] and "127.0.0.1" in event["reason"]
    assert "raytrain: --track mlflow: cannot start" in out and "training goes on without it" in out
    assert scalars(tmp_path / "run-1" / "tensorboard", "loss")[-1][0] == 12  # the other tracker logged all


def test_an_mlflow_server_that_never_answers_is_dropped_after_the_start_bound(tmp_path, capsys, monkeypatch):
    """A server that accepts and never answers: the start is abandoned at START_TIMEOUT_S (set to 3 s here;
    60 s by default) while the steps go on, and a checkpoint's flush waits at most that long for it."""
    import time

    monkeypatch.setattr(trackers, "START_TIMEOUT_S", 3.0, raising=False)
    server = Blackhole()
    try:
        p = plan(tmp_path, ["mlflow"], mlflow_uri=server.uri)
        start = time.monotonic()
        t = trackers.start(p, rank=0, run_name="run-1")
        assert time.monotonic() - start < 1.0
        longest = train_steps(t, range(1, 10))  # the first checkpoint's flush waits for the start's bound
        assert 2.0 < longest < 10.0, longest
        assert time.monotonic() - start < 15
        assert train_steps(t, range(10, 20)) < 1.0  # dropped: no later checkpoint waits for it
        t.finish({})
    finally:
        server.close()
    out = capsys.readouterr().out
    (event,) = dropped_events(out)
    assert event["name"] == "mlflow" and event["reason"] == "its start did not return within 3 s"
    assert "raytrain: --track mlflow: its start did not return within 3 s; training goes on without it" in out


def test_a_tracker_whose_calls_keep_failing_is_dropped(tmp_path, capsys):
    """The MLflow server goes away after the run started: each step's log fails (bounded retries), and after
    MAX_FAILURES in a row the tracker is dropped instead of costing every later step its retries."""
    import time

    server = Blackhole()
    server.close()  # a port that refuses, for the run's lifetime after its start
    p = plan(tmp_path, ["mlflow"])
    t = trackers.start(p, rank=0, run_name="run-1")
    t.flush()
    (slot,) = t.slots
    assert slot.dead is None and slot.tracker is not None
    slot.tracker.client = __import__("mlflow").tracking.MlflowClient(tracking_uri=server.uri)
    start = time.monotonic()
    train_steps(t, range(1, 10))
    deadline = time.monotonic() + 60
    while slot.dead is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slot.dead and "3 calls failed in a row" in slot.dead, slot.dead
    assert time.monotonic() - start < 60
    t.finish({})
    (event,) = dropped_events(capsys.readouterr().out)
    assert event["name"] == "mlflow"
