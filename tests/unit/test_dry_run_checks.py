"""`submit --dry-run` runs every check a real submit runs that needs no cluster: on the local cluster (whose
storage is this machine's) a --resume of a missing run and an unwritable --storage are refused, exit 2."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from raytrain import api
from raytrain.cli.main import main
from raytrain.config import Options
from raytrain.errors import ConfigError
from raytrain.storage import local_storage_problem
from raytrain.targets.local import LocalTarget


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text("def train(ctx):\n    pass\n")
    return str(path)


def _dry_run(*args):
    return CliRunner().invoke(main, ["submit", *args, "--dry-run"])


def test_dry_run_refuses_resume_of_a_missing_run(raytrain_home, job):
    result = _dry_run(job, "--resume", "no-such-run")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("raytrain: error: --resume no-such-run: no such run or checkpoint")


def test_dry_run_refuses_storage_under_a_file(raytrain_home, job, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = _dry_run(job, "--storage", str(blocker / "runs"))
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"raytrain: error: --storage {blocker}/runs: {blocker} is a file, not a folder; give a folder you can write"
    )


def test_dry_run_refuses_storage_it_cannot_write(raytrain_home, job):
    result = _dry_run(job, "--storage", "/proc/raytrain-runs")  # unwritable even for root
    assert result.exit_code == 2, result.output
    assert "raytrain: error: --storage /proc/raytrain-runs: cannot write to /proc" in result.output


def test_the_library_dry_run_and_submit_share_the_checks(raytrain_home, job):
    with pytest.raises(ConfigError) as err:
        api.dry_run(Options(job=job, resume="no-such-run"), LocalTarget(auto_start=False))
    assert err.value.flag == "--resume"


def test_a_writable_storage_passes_and_the_probe_leaves_nothing(raytrain_home, job, tmp_path):
    parent = tmp_path / "store"
    parent.mkdir()
    assert local_storage_problem(str(parent / "not-yet" / "runs")) is None
    assert os.listdir(parent) == []
    assert local_storage_problem("s3://bucket/runs") is None
    result = _dry_run(job, "--storage", str(parent / "runs"))
    assert result.exit_code == 0, result.output
    assert os.listdir(parent) == []
