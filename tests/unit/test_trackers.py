"""--track (issue 17): rank 0's trackers through their real libraries, one tracker run per raytrain run; a
restart (a new Trackers on the same run record) appends at the right step and never logs a step twice."""
import json

import pytest

from raytrain.config.plan import Plan, Scaling
from raytrain.runtime import trackers


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
    return [(e.step, round(e.value, 4)) for e in acc.Scalars(tag)]


def test_tensorboard_and_mlflow_one_run_one_value_per_step_across_a_restart(tmp_path):
    p = plan(tmp_path, ["tensorboard", "mlflow"])
    assert trackers.start(p, rank=1, run_name="run-1") is None  # rank 0 only
    first = run_attempt(p, range(1, 6))
    first.thread.join(timeout=0.1)  # killed: no finish; the queue is drained though
    import time
    deadline = time.time() + 30
    while not first.queue.empty() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
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
    pytest.importorskip("wandb")
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


def test_params_are_the_flags_and_the_exact_deepspeed_config(tmp_path):
    params = trackers.plan_params(plan(tmp_path, ["mlflow"]))
    assert params["deepspeed.bf16.enabled"] is True and params["deepspeed.train_batch_size"] == 8
    assert params["raytrain.track"] == '["mlflow"]' and params["raytrain.zero"] == 3


def test_flush_waits_until_every_queued_step_is_logged(tmp_path):
    t = run_attempt(plan(tmp_path, ["tensorboard"]), range(1, 30))
    t.flush(timeout_s=60)
    assert t.queue.unfinished_tasks == 0
    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    assert state["tensorboard"]["last_step"] == 29
    t.finish({})
