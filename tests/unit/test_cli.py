"""The CLI contract without a cluster: dry runs, exit codes and messages for bad input."""
import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from tests.conftest import JOBS

GPT = str(JOBS / "gpt_zero.py")


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_dry_run_json_is_the_exact_request(raytrain_home):
    r = run("submit", GPT, "--workers", "2", "--zero", "3", "--precision", "bf16", "--grad-accum", "4",
            "--micro-batch", "2", "--dry-run", "--json", "--", "--steps", "5")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["deepspeed"]["train_batch_size"] == 2 * 4 * 2
    assert out["deepspeed"]["zero_optimization"]["stage"] == 3
    assert out["scaling"] == {
        "workers": 2, "num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1.0},
        "placement_strategy": "PACK",
    }
    assert out["entrypoint"].endswith("-m raytrain.runtime.driver.entrypoint")
    env = out["runtime_env"]
    # the local cluster reads this file system: the job runs from a copy made at submit, nothing is uploaded
    code = str(raytrain_home / "job-code" / out["submission_id"])
    assert "working_dir" not in env and out["upload"]["copied_to"] == code
    assert env["env_vars"]["RAYTRAIN_JOB_CODE"] == code
    assert env["env_vars"]["PYTHONPATH"] == code + ":${PYTHONPATH}"
    uploading = json.loads(run("submit", GPT, "--env", "RAYTRAIN_LOCAL_UPLOAD=1", "--dry-run", "--json").output)
    sent = uploading["runtime_env"]
    assert sent["working_dir"] == str(JOBS) and "copied_to" not in uploading["upload"]
    assert ".env" in sent["excludes"] and ".git" in sent["excludes"] and "*.pem" in sent["excludes"]
    shipped = json.loads(env["env_vars"]["RAYTRAIN_PLAN"])
    assert shipped["deepspeed"] == out["deepspeed"]  # workers use exactly the printed config
    assert shipped["job_args"] == ["--steps", "5"]
    assert not (raytrain_home / "cluster.json").exists()  # a dry run starts nothing


def test_dry_run_to_an_address_ships_raytrain(raytrain_home):
    r = run("submit", GPT, "--address", "http://127.0.0.1:1", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["target"] == "address" and out["entrypoint"] == "python -m raytrain.runtime.driver.entrypoint"
    assert out["runtime_env"]["py_modules"][0].endswith("raytrain")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--zero", "5"], "--zero 5: unknown ZeRO stage; use 0, 1, 2 or 3"),
        (["--precision", "fp16", "--gpus-per-worker", "0"], "use --precision bf16"),
        (["--offload", "optimizer", "--zero", "0"], "--offload optimizer needs ZeRO"),
        (["--micro-batch", "3", "--workers", "2", "--train-batch", "10"], "--train-batch 10 is not divisible"),
        (["--env", "NOEQUALS"], "--env NOEQUALS: expected KEY=VALUE"),
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
    ],
)
def test_bad_flags_exit_2_with_the_reason(raytrain_home, args, message):
    r = run("submit", GPT, *args, "--dry-run")
    assert r.exit_code == 2
    assert message in r.output


def test_ds_config_contradiction_exit_2(raytrain_home, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    r = run("submit", GPT, "--zero", "3", "--ds-config", str(ds), "--dry-run")
    assert r.exit_code == 2 and "--zero 3 contradicts --ds-config" in r.output


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), ("def train(ctx:\n", "syntax error"), ("x = 1\n", "no train(ctx)")],
)
def test_bad_job_file_exit_2(raytrain_home, tmp_path, content, message):
    job = tmp_path / "job.py"
    if content is not None:
        job.write_text(content)
    r = run("submit", str(job), "--dry-run")
    assert r.exit_code == 2 and message in r.output


def test_click_usage_errors_exit_2(raytrain_home):
    r = run("submit", GPT, "--precision", "fp64")
    assert r.exit_code == 2 and "fp64" in r.output


def test_unreachable_address_fails_fast(raytrain_home):
    start = time.monotonic()
    r = run("submit", GPT, "--address", "http://127.0.0.1:9")
    assert r.exit_code == 2
    assert "cannot reach the Ray cluster at http://127.0.0.1:9" in r.output
    assert time.monotonic() - start < 10


def test_ray_client_address_is_refused(raytrain_home):
    r = run("submit", GPT, "--address", "ray://head:10001")
    assert r.exit_code == 2 and "give the dashboard address" in r.output


def test_jobs_commands_without_a_cluster(raytrain_home):
    assert "no raytrain jobs" in run("jobs", "list").output
    r = run("jobs", "status", "raytrain-x")
    assert r.exit_code == 2 and "no record of it in" in r.output and "the cluster is not running" in r.output
    assert "no local Ray cluster is running" in run("cluster", "status").output
    assert json.loads(run("cluster", "status", "--json").output) == {"running": False}


def test_cli_never_imports_deepspeed_or_torch(raytrain_home):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from raytrain.cli.main import main\n"
        f"r = CliRunner().invoke(main, ['submit', {GPT!r}, '--workers', '2', '--dry-run', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "bad = [m for m in ('deepspeed', 'torch') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
