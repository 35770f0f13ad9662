"""Bad input of issue 40: refused in one line naming the flag (exit 2), before any file is touched; and the
options that would let a job reach raytrain's own state (--env RAYTRAIN_*) or delete a user's folder
(export --force) refused."""
import math

import click
import pytest
from click.testing import CliRunner

from raytrain import api
from raytrain.cli.common import FiniteFloat
from raytrain.cli.main import main
from raytrain.config.options import USER_ENV_SWITCHES, Options
from raytrain.errors import ConfigError
from raytrain.targets.factory import TargetOptions, make_target
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def every_param(command: click.Command, path=()):
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from every_param(sub, (*path, name))
    for param in command.params:
        yield path, param


def test_every_float_option_refuses_non_finite_numbers():
    floats = [(path, p.name) for path, p in every_param(main) if isinstance(p.type, click.types.FloatParamType)]
    assert floats == [], f"plain click floats (use raytrain.cli.common.FINITE_FLOAT): {floats}"
    finite = [(path, p.name) for path, p in every_param(main) if isinstance(p.type, FiniteFloat)]
    assert (("submit",), "grad_clip") in finite and (("export",), "timeout_s") in finite


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_grad_clip_nan_is_refused(raytrain_home, value):
    r = run("submit", CNN, "--grad-clip", value, "--dry-run")
    assert r.exit_code == 2 and "--grad-clip" in r.output and "not a finite number" in r.output, r.output
    r = run("submit", CNN, "--timeout", value, "--dry-run")
    assert r.exit_code == 2 and "--timeout" in r.output, r.output


def test_non_finite_numbers_are_refused_from_a_profile_and_the_library(raytrain_home, tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("grad-clip: .nan\n")
    r = run("submit", CNN, "--config", profile, "--dry-run")
    assert r.exit_code == 2 and "grad-clip" in r.output and "not a finite number" in r.output, r.output
    with pytest.raises(ConfigError, match="--grad-clip nan: must be a finite number"):
        api.dry_run(Options(job=CNN, grad_clip=math.nan), make_target(TargetOptions()))


def test_status_and_metrics_say_the_same_for_an_unknown_id(raytrain_home):
    status = run("jobs", "status", "no-such-job", "--timings")
    metrics = run("jobs", "metrics", "no-such-job")
    assert status.exit_code == metrics.exit_code == 2
    assert status.output == metrics.output, (status.output, metrics.output)
    assert "no record of it in" in status.output and str(raytrain_home / "runs") in status.output
    assert "the cluster is not running" in status.output


def test_export_checks_its_options_before_the_checkpoint(raytrain_home, tmp_path):
    r = run("export", tmp_path / "no-such-checkpoint", "--format", "hf", "--max-shard-size", "lots",
            "--out", tmp_path / "out")
    assert r.exit_code == 2 and "--max-shard-size lots" in r.output and "2GB" in r.output, r.output
    for good in ("500MB", "2GB", "1GiB"):
        r = run("export", tmp_path / "no-such-checkpoint", "--format", "hf", "--max-shard-size", good,
                "--out", tmp_path / "out")
        assert r.exit_code == 2 and "CHECKPOINT" in r.output and "--max-shard-size" not in r.output, r.output


def test_export_force_never_deletes_a_folder_that_is_not_an_export(raytrain_home, tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text("work\n")
    (project / "config.json").write_text("{}")
    r = run("export", tmp_path / "no-such-checkpoint", "--format", "hf", "--out", project, "--force")
    assert r.exit_code == 2 and "--out" in r.output and "only an earlier --format hf export" in r.output, r.output
    assert (project / "src" / "train.py").read_text() == "work\n"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    r = run("export", tmp_path / "no-such-checkpoint", "--format", "hf", "--out", a_file, "--force")
    assert r.exit_code == 2 and "not a folder" in r.output and a_file.read_text() == "mine", r.output
    # an earlier export (and an empty folder) may be replaced: the command goes on to the checkpoint
    earlier = tmp_path / "earlier"
    (earlier / "base").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "adapter_config.json", "tokenizer.json", "README.md",
                 "base/config.json", "base/model-00001-of-00002.safetensors"):
        (earlier / name).write_text("x")
    (tmp_path / "empty").mkdir()
    for out in (earlier, tmp_path / "empty"):
        r = run("export", tmp_path / "no-such-checkpoint", "--format", "hf", "--out", out, "--force")
        assert r.exit_code == 2 and "CHECKPOINT" in r.output and "--out" not in r.output, r.output


def test_env_may_not_set_raytrains_own_variables(raytrain_home, tmp_path):
    for key in ("RAYTRAIN_JOB_CODE", "RAYTRAIN_PLAN", "RAYTRAIN_HOME", "RAYTRAIN_RUN_NAME"):
        r = run("submit", CNN, "--env", f"{key}=/home/me", "--dry-run")
        assert r.exit_code == 2 and f"--env {key}=..." in r.output and "raytrain's own" in r.output, r.output
        assert "/home/me" not in r.output
    profile = tmp_path / "p.yaml"
    profile.write_text("env: {RAYTRAIN_JOB_CODE: /home/me}\n")
    r = run("submit", CNN, "--config", profile, "--dry-run")
    assert r.exit_code == 2 and "RAYTRAIN_JOB_CODE" in r.output, r.output
    # the documented switches still work
    assert "RAYTRAIN_CPU_ALLOCATOR" in USER_ENV_SWITCHES
    for pair in ("RAYTRAIN_CPU_ALLOCATOR=glibc", "RAYTRAIN_LOCAL_UPLOAD=1", "RAYTRAIN_RAY_TUNING=off", "OTHER=1"):
        r = run("submit", CNN, "--env", pair, "--dry-run")
        assert r.exit_code == 0, (pair, r.output)
