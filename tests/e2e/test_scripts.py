"""Script mode end to end: unmodified deepspeed-launcher and torchrun scripts (tests/e2e/scripts/) on 2 CPU
workers of the real local Ray cluster, through `raytrain submit`. The scripts print their loss on rank 0;
the job's log (`raytrain jobs logs`) is where a launcher's terminal output would be."""
import re

import pytest

from tests.conftest import ROOT
from tests.e2e.test_submit import job_id_of

pytestmark = pytest.mark.e2e

SCRIPTS = ROOT / "tests" / "e2e" / "scripts"


def losses(log: str, tag: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(rf"{tag} step \d+ loss ([0-9.]+)", log)]


def assert_loss_falls(values, steps):
    assert len(values) == steps, values
    assert sum(values[-3:]) / 3 < 0.5 * sum(values[:3]) / 3, values


@pytest.mark.smoke
def test_deepspeed_examples_style_script_trains_unchanged(cli):
    # argparse + --local_rank + deepspeed.add_config_arguments + deepspeed.initialize(args=args, ...): raytrain
    # passes --local_rank=N and --deepspeed --deepspeed_config <its resolved config>, as the launcher would
    proc = cli("submit", SCRIPTS / "ds_regression.py", "--workers", "2", "--zero", "1", "--micro-batch", "8",
               "--", "--steps", "12")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert 'raytrain: script mode (detected: no train(ctx) at module level, and an `if __name__ == "__main__":` ' \
           "block): running ds_regression.py as __main__ on every worker" in proc.stderr
    assert "succeeded" in out
    log = cli("jobs", "logs", job_id_of(out), check=True).stdout
    assert_loss_falls(losses(log, "ds_regression"), 12)
    # the script asserted LOCAL_RANK == args.local_rank, RANK/WORLD_SIZE == the process group's, and got
    # raytrain's config: ZeRO-1, micro-batch 8, global batch 16
    assert "ds_regression done: world 2, zero 1, micro 8, accum 1" in log
    assert "initialize the default process group twice" not in log


def test_torchrun_style_ddp_script_trains_unchanged(cli):
    # init_process_group("gloo") from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT on a group Ray Train already made,
    # DistributedDataParallel, a parser without DeepSpeed options (it must get no unknown option), and
    # destroy_process_group() at the end
    proc = cli("submit", SCRIPTS / "ddp_regression.py", "--workers", "2", "--", "--steps", "12", "--batch", "8")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "raytrain: script mode (detected:" in proc.stderr
    log = cli("jobs", "logs", job_id_of(out), check=True).stdout
    assert_loss_falls(losses(log, "ddp_regression"), 12)
    assert "ddp_regression done: world 2" in log  # the parameters stayed identical on both ranks
    assert "ddp_regression.py parsed no --deepspeed_config option" in log


def test_a_script_that_fails_on_rank_1_fails_the_job_with_its_traceback(cli):
    # no __main__ block: detected by its module-level code
    proc = cli("submit", SCRIPTS / "fails_on_rank1.py", "--workers", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "raytrain: script mode (detected: no train(ctx) at module level, and code at module level (line 6))" \
        in proc.stderr
    assert "on rank 1: ValueError: rank 1 cannot read its shard /data/shard-1" in proc.stderr
    job = job_id_of(out)
    info = cli.json("jobs", "status", job)
    assert info["state"] == "failed" and info["error"]["type"] == "ValueError" and info["error"]["rank"] == 1
    log = cli("jobs", "logs", job, check=True).stdout
    # rank 1's traceback, down to the script's line, is in the job's log
    assert re.search(r'Traceback \(most recent call last\):[\s\S]*fails_on_rank1\.py", line 8', log), log
    assert "ValueError: rank 1 cannot read its shard /data/shard-1" in log
