"""Model partitioning end to end on 2 CPU workers: tensor parallel, pipeline parallel, ZeRO-Offload."""
import json

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def losses_of(cli, job, *flags, steps, built):
    """The run's losses, after checking what its engine built (``built``: fields of the engine event, read from
    the DeepSpeed engine inside the job): equal losses alone would pass a --tp/--pp/--offload dropped on the
    way to the engine."""
    proc = cli("submit", job, *flags, "--json", "--", "--steps", str(steps))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["state"] == "succeeded"
    facts = cli.facts(info["id"])
    assert facts.engine is not None and {k: facts.engine.get(k) for k in built} == built, facts.engine
    return facts.losses, proc


def test_tp2_trains_exactly_like_tp1_in_fp32(cli):
    common = ["--zero", "1", "--precision", "fp32", "--micro-batch", "4", "--grad-accum", "2"]
    batch = {"zero_stage": 1, "micro_batch": 4, "grad_accum": 2, "dp": 1, "pp": 1}
    tp1, _ = losses_of(cli, JOBS / "gpt_tp.py", "--workers", "1", "--tp", "1", *common, steps=8,
                       built={**batch, "tp": 1, "tp_layers": 0})
    tp2, proc = losses_of(cli, JOBS / "gpt_tp.py", "--workers", "2", "--tp", "2", *common, steps=8,
                          built={**batch, "tp": 2, "tp_layers": 12})
    assert "tensor parallel 2: splitting 12 Linear layers (8 column, 4 row)" in proc.stderr
    assert len(tp2) == len(tp1) == 8
    assert max(abs(a - b) for a, b in zip(tp1, tp2)) < 1e-5, (tp1, tp2)
    assert sum(tp2[-3:]) / 3 < tp2[0] - 0.05  # and it learns


def test_pp2_with_zero1_trains(cli):
    losses, proc = losses_of(cli, JOBS / "gpt_pipe.py", "--workers", "2", "--pp", "2", "--zero", "1",
                             "--grad-accum", "4", "--micro-batch", "2", steps=8,
                             built={"pp": 2, "dp": 1, "tp": 1, "zero_stage": 1, "micro_batch": 2, "grad_accum": 4})
    assert len(losses) == 8 and sum(losses[-3:]) / 3 < losses[0] - 0.05, losses
    assert "ZeRO-1" in proc.stderr


def test_offload_optimizer_with_zero2_runs(cli):
    losses, _ = losses_of(cli, JOBS / "gpt_zero.py", "--workers", "2", "--zero", "2", "--offload", "optimizer",
                          "--micro-batch", "2", "--grad-accum", "2", steps=6,
                          built={"zero_stage": 2, "offload_optimizer": "cpu", "dp": 2, "micro_batch": 2,
                                 "grad_accum": 2})
    assert len(losses) == 6 and losses[-1] < losses[0]
