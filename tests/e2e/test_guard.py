"""The non-finite guard and honest endings (issue 37), on real engines.

One ``inf`` input on rank 1 at step 6 (tests/e2e/jobs/nonfinite.py, the model and data of the layout tests):
``--zero 0``, ``--zero 1``, ``--zero 3``, ``--pp 2``, ZeRO-2 with ``--offload optimizer`` and ``--tp 2`` all
skip step 6 on every rank, say so, and end with
the parameters (through their probe loss, as tests/e2e/test_equivalence.py compares layouts) of a clean run in
which step 6 makes no update; every other step's loss matches that run's too. So each run is also those
layouts' equivalence test: their losses at 7 of 8 steps and their final parameters equal the clean ZeRO-1
run's (the layout test_equivalence.py checks against one worker), and the engine each built is the layout's
(test_equivalence.assert_built). A job that ends reporting a NaN loss ends failed, exit 1, with the reason.
"""
import math

import pytest

from tests.e2e.test_equivalence import FP32_TOL, assert_built, close
from tests.e2e.test_submit import job_id_of

pytestmark = pytest.mark.e2e

JOB = __import__("pathlib").Path(__file__).parent / "jobs" / "nonfinite.py"
STEPS, BAD = 8, 5  # loop index 5 is the step reported as 6
DP = ["--workers", "2", "--micro-batch", "2", "--grad-accum", "2"]
LAYOUTS = {
    "zero0": [*DP, "--zero", "0"],
    "zero1": [*DP, "--zero", "1"],
    "zero3": [*DP, "--zero", "3"],
    "pp2": ["--workers", "2", "--pp", "2", "--micro-batch", "4", "--grad-accum", "2"],
    "offload-optimizer": [*DP, "--zero", "2", "--offload", "optimizer"],
    "tp2": ["--workers", "2", "--tp", "2", "--micro-batch", "4", "--grad-accum", "2"],
}
# where the bad sample's loss is computed: rank 1 with 2 data-parallel ranks and under --pp 2 (the last stage);
# both ranks of one tensor-parallel group compute it
SAID = {"tp2": "step 6 skipped: non-finite loss on ranks 0, 1"}


def run(cli, flags, bad):
    proc = cli("submit", JOB, *flags, "--", "--steps", str(STEPS), "--bad-step", str(BAD), "--bad", bad,
               timeout=420)
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def clean(e2e_env):
    proc, out = run(e2e_env, LAYOUTS["zero1"], "zero")
    assert proc.returncode == 0, out
    facts = e2e_env.facts(job_id_of(out))
    assert not facts.skipped, facts.skipped
    return facts.metrics


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_inf_on_rank_1_skips_step_6_everywhere(cli, clean, name):
    proc, out = run(cli, LAYOUTS[name], "inf")
    assert proc.returncode == 0, out
    said = SAID.get(name, "step 6 skipped: non-finite loss on rank 1")
    assert said in out, out  # the terminal
    facts = cli.facts(job_id_of(out))
    assert [e["step"] for e in facts.skipped] == [6], facts.skipped
    assert facts.skipped[0]["message"] == said and facts.skipped[0]["ranks"]["1"] == "loss", facts.skipped
    metrics = facts.metrics
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), metrics  # the skip counts as a step
    assert metrics[-1]["skipped_steps"] == 1, metrics[-1]
    assert_built(facts, name, metrics[-1])
    probe, ref_probe = metrics[-1]["probe_loss"], clean[-1]["probe_loss"]
    assert math.isfinite(probe) and close(probe, ref_probe, FP32_TOL), (name, probe, ref_probe)
    for m, ref in zip(metrics, clean):
        if m["step"] != BAD + 1:
            assert close(m["loss"], ref["loss"], FP32_TOL), (name, m, ref)
    status = cli("jobs", "status", job_id_of(out))
    assert said in status.stdout, status.stdout


def test_a_run_ending_with_a_nan_loss_fails(cli):
    proc, out = run(cli, ["--workers", "1", "--zero", "1", "--micro-batch", "4", "--grad-accum", "2"], "report-nan")
    assert proc.returncode == 1, out
    assert "the run ended with a non-finite loss (nan) at step 8" in out, out
    info = cli.json("jobs", "status", job_id_of(out))
    assert info["state"] == "failed", info
