"""--checkpoint-mode: its default and refusals, the host memory `raytrain plan` shows for an async snapshot, and
`jobs checkpoints` listing committed checkpoints only. No Ray, no torch."""
import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main as cli
from raytrain.config import Options, resolve
from raytrain.errors import ConfigError
from raytrain.planner import memory
from tests.conftest import JOBS, ROOT
from tests.unit.test_checkpoints import make_checkpoint

SCRIPTS = ROOT / "tests" / "e2e" / "scripts"


def plan(**kw):
    kw.setdefault("job", str(JOBS / "cnn.py"))
    return resolve(Options(**kw))


def test_async_is_the_default_of_train_ctx_jobs_and_sync_can_be_chosen():
    assert plan().checkpoint_mode == "async"
    assert plan(checkpoint_mode="sync").checkpoint_mode == "sync"
    assert json.loads(plan(checkpoint_mode="sync").to_json())["checkpoint_mode"] == "sync"  # travels in the plan


def test_a_trainer_script_saves_sync_and_refuses_async():
    assert plan(job=str(SCRIPTS / "hf_trainer.py")).checkpoint_mode == "sync"
    with pytest.raises(ConfigError, match="--checkpoint-mode async: a Hugging Face Trainer script") as err:
        plan(job=str(SCRIPTS / "hf_trainer.py"), checkpoint_mode="async")
    assert err.value.flag == "--checkpoint-mode"


def test_a_plain_script_refuses_the_flag():
    with pytest.raises(ConfigError, match="--checkpoint-mode: raytrain checkpoints through"):
        plan(job=str(SCRIPTS / "ds_regression.py"), checkpoint_mode="sync")


def test_a_bad_mode_is_refused_by_the_cli_with_the_choices():
    result = CliRunner().invoke(cli, ["submit", str(JOBS / "cnn.py"), "--checkpoint-mode", "later", "--dry-run"])
    assert result.exit_code == 2 and "'later' is not one of 'async', 'sync'" in result.output, result.output


def test_the_snapshot_is_the_largest_rank_files():
    # bf16: 2-byte parameters (the model file) + Adam's fp32 master and moments (12 bytes), partitioned from ZeRO-1
    assert memory.checkpoint_snapshot(1e9, stage=1, precision="bf16", dp=4) == 2e9 + 12e9 / 4
    assert memory.checkpoint_snapshot(1e9, stage=0, precision="bf16", dp=4) == 2e9 + 12e9
    # fp32: the parameters are the master copy; a ZeRO optimizer saves its fp32 partition beside the moments
    assert memory.checkpoint_snapshot(1e9, stage=0, precision="fp32", dp=2) == 4e9 + 8e9
    assert memory.checkpoint_snapshot(1e9, stage=3, precision="fp32", dp=2) == 4e9 + 12e9 / 2
    # frozen parameters have no optimizer state
    assert memory.checkpoint_snapshot(1e9, stage=1, precision="bf16", dp=1, trainable=1e6) == 2e9 + 12e6


def test_plan_shows_the_snapshot_per_rank():
    args = ["plan", "--params", "1B", "--layers", "16", "--hidden", "2048", "--gpus", "4", "--gpu-memory", "80GB",
            "--zero", "1", "--precision", "bf16"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    line = next(l for l in result.output.splitlines() if l.startswith("async checkpoints"))
    assert "a snapshot of 5.0 GB of host memory per rank" in line, line
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert data["chosen"]["checkpoint_snapshot_per_rank"] == 5_000_000_000


def test_jobs_checkpoints_lists_committed_ones_unless_all(tmp_path):
    run = tmp_path / "run"
    make_checkpoint(run, "checkpoint_a", 3)
    partial = make_checkpoint(run, "checkpoint_b", 6)
    (partial / "raytrain_rank1.json").unlink()  # rank 1 died mid-upload
    listed = json.loads(CliRunner().invoke(cli, ["jobs", "checkpoints", str(run), "--json"]).output)
    assert [c["step"] for c in listed] == [3]
    every = json.loads(CliRunner().invoke(cli, ["jobs", "checkpoints", str(run), "--json", "--all"]).output)
    assert [(c["step"], c["complete"]) for c in every] == [(3, True), (6, False)]
    shown = CliRunner().invoke(cli, ["jobs", "checkpoints", str(run)])
    assert "1 uncommitted checkpoint(s) not listed" in shown.output and "checkpoint_b" not in shown.output
