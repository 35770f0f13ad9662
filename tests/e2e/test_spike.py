"""--spike-guard and rollbacks (issue 37) on real engines: a loss spike injected at one global batch with
``--spike-guard --rollback-after 1`` is skipped (the message names the batch's rows), the run rolls back to its
last checkpoint, reads on without exactly those rows, and ends with the parameters of a run whose dataset
omits them (to test_guard's tolerance); a clean run with the guard on has no false alarm.

The data: 120 rows, 2 workers, micro-batch 2, no shuffle: one epoch of 30 steps; each rank reads a contiguous
chunk of 60 rows (raytrain.runtime.datasets.batches's tail split: fewer rows than one round of pieces), so step s holds
rows 2(s-1), 2(s-1)+1 (rank 0) and 60+2(s-1), 60+2(s-1)+1 (rank 1). The spike: the batch holding row 48, step 25.
"""
import json

import numpy as np
import pytest

from tests.e2e.test_equivalence import FP32_TOL, close
from tests.e2e.test_submit import job_id_of

pytestmark = pytest.mark.e2e

JOB = __import__("pathlib").Path(__file__).parent / "jobs" / "spike.py"
ROWS = 120
FLAGS = ["--workers", "2", "--zero", "0", "--micro-batch", "2", "--grad-accum", "1", "--checkpoint-every", "10",
         "--spike-guard"]
SPIKE_STEP, BAD_ROWS = 25, [48, 49, 108, 109]


def write(path, omit=()):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(8)
    with open(path, "w") as f:
        for i in range(ROWS):
            x = rng.standard_normal(8).round(4)
            if i not in omit:
                f.write(json.dumps({"id": i, "x": x.tolist(), "y": float(x @ w)}) + "\n")
    return path


def run(cli, data, *flags, args=()):
    proc = cli("submit", JOB, *FLAGS, "--data", f"train={data}", *flags, "--", *args, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    job = job_id_of(out)
    log = cli("jobs", "logs", job, check=True).stdout
    (line,) = {l[l.index("@@params "):] for l in log.splitlines() if "@@params " in l}
    return job, out, json.loads(line[len("@@params "):])


def test_a_spike_rolls_back_and_skips_exactly_its_rows(e2e_env, tmp_path):
    cli = e2e_env
    job, out, final = run(cli, write(tmp_path / "rows.jsonl"), "--rollback-after", "1", args=["--spike-ids", "48"])
    facts = cli.facts(job)
    (skip,) = facts.skipped
    assert skip["step"] == SPIKE_STEP and skip["message"].startswith(f"step {SPIKE_STEP} skipped: loss spike"), skip
    rows = ", ".join(map(str, BAD_ROWS))
    assert skip["message"].endswith(f"(rows {rows})"), skip  # the skip message names the batch's rows
    assert skip["message"] in out, out[-4000:]  # the terminal
    (back,) = facts.rollbacks
    assert back["rows"] == {"train": {"0": BAD_ROWS}} and back["to_step"] == 20, back
    said = f"rollback 1 of at most 3: 1 bad step in a row (last: {skip['message']}); back to the checkpoint of step 20"
    assert back["message"].startswith(said), back
    assert said in out, out[-4000:]
    status = cli("jobs", "status", job, check=True).stdout
    assert said in status, status
    assert facts.restarts == 0, facts.restarts  # not a failure: --max-failures 0 still
    # the rolled-back run read one step fewer: the spike's rows are gone, nothing else
    assert final["step"] == ROWS // 4 - 1 and final["skipped_steps"] == 0, final

    ref_job, ref_out, ref = run(cli, write(tmp_path / "omitted.jsonl", omit=BAD_ROWS))
    ref_facts = cli.facts(ref_job)
    assert not ref_facts.skipped and not ref_facts.rollbacks, ref_facts.skipped  # no false alarm
    assert ref["step"] == final["step"], (ref, final)
    assert all(close(a, b, FP32_TOL) for a, b in zip(final["params"], ref["params"])), (final, ref)


def test_past_max_rollbacks_the_job_fails_with_the_reason(e2e_env, tmp_path):
    cli = e2e_env
    proc = cli("submit", JOB, *FLAGS, "--data", f"train={write(tmp_path / 'rows.jsonl')}", "--rollback-after", "1",
               "--max-rollbacks", "0", "--", "--spike-ids", "48", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    reason = "1 bad step in a row (last: step 25 skipped: loss spike"
    assert reason in out and "after 0 rollbacks (--max-rollbacks 0)" in out, out[-4000:]
    info = cli.json("jobs", "status", job_id_of(out))
    assert info["state"] == "failed" and info["error"]["type"] == "RollbackLimit", info["error"]
    assert reason in info["error"]["message"] and not info["rollbacks"], info
