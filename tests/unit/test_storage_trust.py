"""trackers.json lives in the storage, which others may be able to write: on a restart or a --resume it is
followed only to this run's own folder (or the one --resume continues) and the plan's own MLflow URI, never to
a folder or server someone wrote into it."""
import json
from pathlib import Path

import pytest

from raytrain import run_record
from raytrain.config.plan import Plan, Scaling
from raytrain.runtime.tracking import trackers


def plan(storage, track, **kw):
    return Plan(name="gpt", job_file="/j/gpt.py", job_dir="/j", job_module="gpt.py", job_args=[], deepspeed={},
                scaling=Scaling(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
                parallel={"dp": 1, "tp": 1, "pp": 1}, train_batch=1, precision="fp32", zero=0, offload="none",
                storage=str(storage), track=track, **kw)


def plant(record: Path, data: dict) -> None:
    record.mkdir(parents=True, exist_ok=True)
    (record / "trackers.json").write_text(json.dumps(data))


def test_a_planted_trackers_json_cannot_redirect_the_metrics(tmp_path):
    pytest.importorskip("mlflow")
    elsewhere = tmp_path / "attacker"
    storage = tmp_path / "storage"
    plant(storage / "run-1" / "raytrain", {
        "tensorboard": {"dir": str(elsewhere / "tb"), "last_step": 0},
        "mlflow": {"uri": f"sqlite:///{elsewhere / 'mlflow.db'}", "run_id": "0" * 32, "last_step": 0},
    })
    lines = []
    t = trackers.start(plan(storage, ["tensorboard", "mlflow"]), rank=0, run_name="run-1", log=lines.append)
    t.report({"step": 1, "loss": 1.0})
    t.finish({})
    assert not elsewhere.exists(), list(elsewhere.rglob("*"))
    state = json.loads((storage / "run-1" / "raytrain" / "trackers.json").read_text())
    assert state["tensorboard"]["dir"] == str(storage / "run-1" / "tensorboard")
    assert state["mlflow"]["uri"].startswith(f"sqlite:///{(storage / 'run-1').resolve()}")
    assert state["mlflow"]["run_id"] != "0" * 32 and state["tensorboard"]["last_step"] == 1
    assert any("not using tensorboard" in line for line in lines), lines
    assert any("not using mlflow" in line for line in lines), lines


def test_the_plans_own_mlflow_uri_only(tmp_path):
    kept, dropped = run_record.trusted_trackers(
        {"mlflow": {"uri": "http://evil:5000", "run_id": "a" * 32}}, [tmp_path / "run"], "http://mine:5000")
    assert kept == {} and "mlflow" in dropped[0]
    kept, dropped = run_record.trusted_trackers(
        {"mlflow": {"uri": "http://mine:5000", "run_id": "a" * 32}}, [tmp_path / "run"], "http://mine:5000")
    assert "mlflow" in kept and not dropped
    kept, dropped = run_record.trusted_trackers({"wandb": {"id": "../../x"}, "other": {}}, [tmp_path], None)
    assert kept == {} and len(dropped) == 2


def test_resume_inherits_only_the_continued_runs_own_entries(tmp_path):
    storage = tmp_path / "storage"
    old_run = storage / "old"
    checkpoint = old_run / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    plant(old_run / "raytrain", {
        "tensorboard": {"dir": str(old_run / "tensorboard"), "last_step": 4},
        "mlflow": {"uri": "sqlite:////etc/raytrain-owned.db", "run_id": "b" * 32, "last_step": 4},
        "wandb": {"id": "abc123", "last_step": 4},
    })
    assert run_record.inherit_trackers(str(checkpoint), str(storage), "new")
    state = json.loads((storage / "new" / "raytrain" / "trackers.json").read_text())
    assert sorted(state) == ["tensorboard", "wandb"] and state["tensorboard"]["last_step"] == 4
    # the new run's rank 0 accepts the continued run's folder (--resume names it) and nothing else
    p = plan(storage, ["tensorboard"], resume="old")
    found = trackers.State(storage / "new" / "raytrain")
    found.trust(p, storage / "new", log=lambda line: None)
    assert found.data["tensorboard"]["dir"] == str(old_run / "tensorboard")
    unrelated = trackers.State(storage / "new" / "raytrain")
    unrelated.trust(plan(storage, ["tensorboard"]), storage / "new", log=lambda line: None)
    assert "tensorboard" not in unrelated.data
