"""--env values stay out of what is shown (--dry-run) and out of the plan the cluster shows; on Kubernetes
--env-from-secret reads a value from a Secret (secretKeyRef) so it is in no object at all."""
import json

import yaml
from click.testing import CliRunner

from raytrain import api
from raytrain.cli.main import main
from raytrain.config.options import Options
from raytrain.targets.factory import TargetOptions, make_target
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")
SECRET = "hunter2-s3cr3t"


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_dry_run_masks_env_values_and_the_shipped_plan_never_has_them(raytrain_home):
    for extra in ([], ["--json"]):
        r = run("submit", CNN, "--workers", "2", "--env", f"TOKEN={SECRET}", "--dry-run", *extra)
        assert r.exit_code == 0, r.output
        assert SECRET not in r.output
    out = json.loads(run("submit", CNN, "--workers", "2", "--env", f"TOKEN={SECRET}", "--dry-run", "--json").output)
    assert out["runtime_env"]["env_vars"]["TOKEN"] == "<hidden>"
    # what is sent: the workers get the value; the plan (shown on the dashboard) does not carry it
    _, request = api.dry_run(Options(job=CNN, workers=2, env={"TOKEN": SECRET}), make_target(TargetOptions()))
    env_vars = request.runtime_env["env_vars"]
    assert env_vars["TOKEN"] == SECRET and SECRET not in env_vars["RAYTRAIN_PLAN"]


def test_rayjob_dry_run_masks_and_env_from_secret_uses_secret_key_refs(raytrain_home, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none")}
    args = ["submit", CNN, "--k8s", "--rayjob", "-n", "t", "--working-dir", "/app", "--workers", "2",
            "--gpus-per-worker", "0", "--env", f"TOKEN={SECRET}",
            "--env-from-secret", "WANDB_API_KEY=wandb/api-key", "--dry-run"]
    r = run(*args, env=env)
    assert r.exit_code == 0, r.output
    assert SECRET not in r.output
    rayjob = next(yaml.safe_load_all(r.output))
    cluster = rayjob["spec"]["rayClusterSpec"]
    for t in [cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]]:
        envs = {e["name"]: e for e in t["spec"]["containers"][0]["env"]}
        assert envs["WANDB_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}


def test_env_from_secret_is_refused_where_it_cannot_work(raytrain_home, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none")}
    base = ["submit", CNN, "--workers", "2", "--dry-run"]
    for extra, words in [
        (["--env-from-secret", "A=s/k"], "--env-from-secret is a Kubernetes option"),
        (["--k8s", "--rayjob", "-n", "t", "--env-from-secret", "A=nokey"], "expected NAME=SECRET/KEY"),
    ]:
        r = run(*base, *extra, env=env)
        assert r.exit_code == 2 and words in r.output, (extra, r.output)
