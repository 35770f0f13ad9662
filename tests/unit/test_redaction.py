"""Secrets in job arguments, --mlflow-uri and --data stay out of what raytrain shows (--dry-run), what Ray Train
keeps (train_loop_config) and what the trackers store (real TensorBoard, MLflow and W&B offline files); the
workers still get the real values."""
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raytrain import api, redact
from raytrain.cli.main import main
from raytrain.config.options import Options
from raytrain.config.plan import Plan, Scaling
from raytrain.targets.factory import TargetOptions, make_target
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")
TOKEN = "hf_" + "Q7w9" * 8  # the form of a Hugging Face token
PASSWORD = "pw-1s-s3cret"
SIGNATURE = "a1b2c3d4e5f6sig"
MLFLOW_URI = f"https://bob:{PASSWORD}@mlflow.example.com/?token=tok-{PASSWORD}"
DATA_URI = f"s3://bucket/train.jsonl?X-Amz-Credential=AKIDX&X-Amz-Signature={SIGNATURE}"
SECRETS = (TOKEN, PASSWORD, SIGNATURE)


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def assert_clean(text: str | bytes, where: str = "") -> None:
    for secret in SECRETS:
        found = secret.encode() in text if isinstance(text, bytes) else secret in text
        assert not found, (secret, where, text[:3000])


def test_the_rules():
    assert redact.args(["--hub_token", TOKEN, "--steps", "3"]) == ["--hub_token", "<hidden>", "--steps", "3"]
    assert redact.args(["--api-key=abc", "password=x", "--tokenizer", "gpt2", "--max_tokens", "5"]) == [
        "--api-key=<hidden>", "password=<hidden>", "--tokenizer", "gpt2", "--max_tokens", "5"]
    assert redact.args(["--note", f"uses {TOKEN}"]) == ["--note", "uses <hidden>"]  # a token by its form
    assert redact.args(["--flag-token", "--steps", "3"]) == ["--flag-token", "--steps", "3"]  # no value
    assert redact.text("https://u:p@host/x") == "https://<hidden>@host/x"
    assert redact.text(DATA_URI) == "s3://bucket/train.jsonl?X-Amz-Credential=<hidden>&X-Amz-Signature=<hidden>"
    assert redact.text("https://a.blob.core.windows.net/c/f?sv=2021&sig=abc") == \
        "https://a.blob.core.windows.net/c/f?sv=2021&sig=<hidden>"
    assert redact.text(redact.text(DATA_URI)) == redact.text(DATA_URI)  # shown twice, masked once
    assert redact.mapping({"aws": {"secret_access_key": "x", "region": "eu"}, "AWSAccessKeyId": "y"}) == {
        "aws": {"secret_access_key": "<hidden>", "region": "eu"}, "AWSAccessKeyId": "<hidden>"}


def dry_run_args():
    return [CNN, "--workers", "2", "--track", "mlflow", "--mlflow-uri", MLFLOW_URI, "--data", DATA_URI,
            "--dry-run"]


def test_dry_run_shows_no_job_argument_uri_or_signature_secret(raytrain_home):
    for extra in ([], ["--json"]):
        r = run("submit", *dry_run_args(), *extra, "--", "--hub_token", TOKEN, "--steps", "3")
        assert r.exit_code == 0, r.output
        assert_clean(r.output, f"dry run {extra}")
        assert "--hub_token <hidden> --steps 3" in r.output or '"--hub_token",' in r.output
    out = json.loads(run("submit", *dry_run_args(), "--json", "--", "--hub_token", TOKEN).output)
    shown = json.loads(out["runtime_env"]["env_vars"]["RAYTRAIN_PLAN"])  # the plan as the dashboard would show
    assert shown["job_args"] == ["--hub_token", "<hidden>"] and out["plan"]["job_args"] == ["--hub_token", "<hidden>"]
    # what is sent: the driver and workers get the real values (the job needs its token)
    _, request = api.dry_run(Options(job=CNN, workers=2, job_args=["--hub_token", TOKEN]), make_target(TargetOptions()))
    assert json.loads(request.runtime_env["env_vars"]["RAYTRAIN_PLAN"])["job_args"] == ["--hub_token", TOKEN]


def test_rayjob_dry_run_shows_no_job_argument_secret(raytrain_home, tmp_path):
    r = run("submit", CNN, "--k8s", "--rayjob", "-n", "t", "--working-dir", "/app", "--workers", "2",
            "--gpus-per-worker", "0", "--dry-run", "--", "--hub_token", TOKEN, env={"KUBECONFIG": str(tmp_path / "none")})
    assert r.exit_code == 0, r.output
    assert_clean(r.output, "rayjob")
    rayjob = next(yaml.safe_load_all(r.output))
    env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]
    assert json.loads(env["RAYTRAIN_PLAN"])["job_args"] == ["--hub_token", "<hidden>"]


def plan(storage, **kw):
    fields = dict(
        name="gpt", job_file="/j/gpt.py", job_dir="/j", job_module="gpt.py", job_args=["--hub_token", TOKEN, "--steps", "3"],
        deepspeed={"train_batch_size": 8, "zero_optimization": {"stage": 1}},
        scaling=Scaling(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        parallel={"dp": 2, "tp": 1, "pp": 1}, train_batch=8, precision="fp32", zero=1, offload="none",
        storage=str(storage), data=[{"name": "train", "path": DATA_URI, "format": "json"}],
    )
    fields.update(kw)
    return Plan(**fields)


def test_ray_trains_config_is_redacted_and_the_workers_get_the_real_plan(tmp_path, monkeypatch):
    from raytrain.runtime.worker.loop import plan_of

    real = plan(tmp_path, mlflow_uri=MLFLOW_URI)
    config = {"plan": redact.plan_dict(real.to_dict())}  # what the driver gives Ray Train (runtime/driver/entrypoint.py)
    assert_clean(json.dumps(config), "train_loop_config")
    monkeypatch.setenv("RAYTRAIN_PLAN", real.to_json())  # every process of the job inherits it
    assert plan_of(config) == real


def all_bytes(folder: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize("track_args", [False, True])
def test_tracker_files_hold_no_secret_and_job_args_only_when_asked(tmp_path, monkeypatch, track_args):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from raytrain.runtime.tracking import trackers

    p = plan(tmp_path, track=["tensorboard", "mlflow", "wandb"], track_args=track_args)
    lines = []
    t = trackers.start(p, rank=0, run_name="run-1", log=lines.append)
    t.report({"step": 1, "loss": 1.0})
    t.flush(timeout_s=120)  # each tracker starts on a thread of its own
    assert [tr.name for tr in t.active] == ["tensorboard", "mlflow", "wandb"], lines
    t.finish({"steps": 1})
    assert [tr.name for tr in t.active] == ["tensorboard", "mlflow", "wandb"], lines  # none dropped at close
    import wandb

    # W&B's service writes the run file when it closes the run's stream, after finish() returns (told by a
    # message finish does not wait on; it does so even when the worker is killed right after): teardown waits.
    wandb.teardown()
    files = all_bytes(tmp_path / "run-1")
    assert any(p.name.startswith("events.out.tfevents") for p, _ in files)
    assert any(p.suffix == ".wandb" for p, _ in files)
    for path, data in files:
        assert_clean(data, str(path))
    from mlflow.tracking import MlflowClient

    state = json.loads((tmp_path / "run-1" / "raytrain" / "trackers.json").read_text())
    params = MlflowClient(tracking_uri=state["mlflow"]["uri"]).get_run(state["mlflow"]["run_id"]).data.params
    assert params["raytrain.data"].count("<hidden>") == 2
    if track_args:
        assert json.loads(params["raytrain.job_args"]) == ["--hub_token", "<hidden>", "--steps", "3"]
    else:
        assert "raytrain.job_args" not in params
    run_file = b"".join(data for path, data in files if path.suffix == ".wandb")  # W&B's config is in it
    assert (b"raytrain.job_args" in run_file) == track_args and b"raytrain.mlflow_uri" in run_file, (len(run_file), lines)


def test_track_args_needs_a_tracker(raytrain_home):
    r = run("submit", CNN, "--track-args", "--dry-run")
    assert r.exit_code == 2 and "--track-args" in r.output, r.output
    r = run("submit", CNN, "--track", "tensorboard", "--track-args", "--dry-run", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["plan"]["track_args"] is True, r.output


def test_error_messages_do_not_repeat_the_secret(raytrain_home):
    r = run("submit", CNN, "--mlflow-uri", MLFLOW_URI, "--dry-run")
    assert r.exit_code == 2 and "--mlflow-uri" in r.output
    assert_clean(r.output)
    r = run("submit", CNN, "--data", "train=" + DATA_URI.replace("train.jsonl", "noext"), "--dry-run")
    assert r.exit_code == 2 and "--data" in r.output
    assert_clean(r.output)
    assert os.environ.get("RAYTRAIN_PLAN") is None
