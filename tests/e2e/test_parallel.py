"""Model partitioning end to end on 2 CPU workers: tensor parallel, pipeline parallel, ZeRO-Offload."""
import json

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def losses_of(cli, job, *flags, steps):
    proc = cli("submit", job, *flags, "--json", "--", "--steps", str(steps))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["state"] == "succeeded"
    return cli.facts(info["id"]).losses, proc


def test_tp2_trains_exactly_like_tp1_in_fp32(cli):
    common = ["--zero", "1", "--precision", "fp32", "--micro-batch", "4", "--grad-accum", "2"]
    tp1, _ = losses_of(cli, JOBS / "gpt_tp.py", "--workers", "1", "--tp", "1", *common, steps=8)
    tp2, proc = losses_of(cli, JOBS / "gpt_tp.py", "--workers", "2", "--tp", "2", *common, steps=8)
    assert "tensor parallel 2: splitting 12 Linear layers (8 column, 4 row)" in proc.stderr
    assert len(tp2) == len(tp1) == 8
    assert max(abs(a - b) for a, b in zip(tp1, tp2)) < 1e-5, (tp1, tp2)
    assert sum(tp2[-3:]) / 3 < tp2[0] - 0.05  # and it learns


def test_pp2_with_zero1_trains(cli):
    losses, proc = losses_of(cli, JOBS / "gpt_pipe.py", "--workers", "2", "--pp", "2", "--zero", "1",
                             "--grad-accum", "4", "--micro-batch", "2", steps=8)
    assert len(losses) == 8 and sum(losses[-3:]) / 3 < losses[0] - 0.05, losses
    assert "ZeRO-1" in proc.stderr


def test_offload_optimizer_with_zero2_runs(cli):
    losses, _ = losses_of(cli, JOBS / "gpt_zero.py", "--workers", "2", "--zero", "2", "--offload", "optimizer",
                          "--micro-batch", "2", "--grad-accum", "2", steps=6)
    assert len(losses) == 6 and losses[-1] < losses[0]
