"""Preemption-aware checkpoints on the real local cluster: a SIGTERM to one worker mid-run commits a checkpoint
at the step in progress (with --checkpoint-every far beyond the run), the group restarts from it, no step is
lost and at most one redone, and the run ends with the weights of an uninterrupted run; goodput adds up."""
import json
import os
import signal
import threading
import time

import pytest

from tests.conftest import JOBS
from tests.e2e.conftest import GPT_Z3, submit_json
from tests.e2e.test_checkpoints import assert_same_weights

pytestmark = pytest.mark.e2e

# the baseline's job and flags (GPT_Z3), with --checkpoint-every far beyond the run: only a preemption (and the end)
# commits a checkpoint
FLAGS = [*GPT_Z3[:GPT_Z3.index("--checkpoint-every")], "--checkpoint-every", "1000"]


def submit_in_background(cli, flags, job_args):
    """`raytrain submit ... --json` on a thread: (thread, {"proc": its CompletedProcess once done})."""
    out = {}

    def run():
        out["proc"] = cli("submit", JOBS / "gpt_zero.py", *flags, "--json", "--", *job_args, timeout=600)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_for_file(path, thread, timeout=400):
    """The job's handshake file (written by each rank after the handshake step); fails if the submit ended
    first or after ``timeout`` s (a start-up on a loaded 2-core machine can take minutes)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert thread.is_alive(), "the job ended before its handshake"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_sigterm_to_a_worker_commits_the_step_in_progress_and_resumes_from_it(cli, gpt_baseline, tmp_path):
    base, base_facts, _ = gpt_baseline  # the same job and flags, but for --checkpoint-every
    thread, out = submit_in_background(cli, [*FLAGS, "--max-failures", "1"],
                                       ["--steps", "10", "--preempt-handshake", f"{tmp_path}:5"])
    worker = wait_for_file(tmp_path / "rank-1.json", thread)
    os.kill(worker["pid"], signal.SIGTERM)  # every rank waits after step 5 until rank 1 has its notice
    thread.join(timeout=600)
    proc = out["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    facts = cli.facts(info["id"])
    assert info["state"] == "succeeded" and info["restarts"] == 1, info
    assert (tmp_path / "notice").read_text().startswith("rank 1: SIGTERM")  # the handshake: rank 1 had it
    (preempted,) = facts.preempted
    assert preempted["message"].startswith("preempted: SIGTERM on rank 1 (node "), preempted
    # the notice came while step 6 was in progress: step 6 is committed and the restart continues after it
    assert preempted["saved"] is True and preempted["step"] == 6 and preempted["save_s"] > 0, preempted
    assert facts.checkpoints == [6, 10], facts.checkpoints
    steps = [m["step"] for m in facts.metrics]
    assert sorted(set(steps)) == list(range(1, 11)) and len(steps) - len(set(steps)) <= 1, steps
    assert facts.losses[-4:] == pytest.approx(base_facts.losses[-4:], rel=1e-6, abs=0)
    assert_same_weights(cli, info["id"], base["id"], tmp_path)

    # goodput of a run with one failure (the preemption's restart): its parts add up to its wall time
    status = cli.json("jobs", "status", info["id"])
    g = status["goodput"]
    assert g is not None and 0 < g["goodput"] < 1, g
    assert abs(sum(g["parts"].values()) - g["wall_s"]) <= 0.02 * g["wall_s"], g
    assert g["parts"]["restarts"] > 0 and g["parts"]["checkpoint"] > 0, g
    text = cli("jobs", "status", info["id"], check=True).stdout
    assert "preempted SIGTERM on rank 1" in text and "goodput " in text, text


def driver_pid(cli, job_id, timeout=60):
    """The process id of a running job's driver, as Ray's job API reports it."""
    from pathlib import Path

    from raytrain.clusters import ray_process
    from raytrain.clusters.dashboard import Dashboard, token_headers

    record = json.loads((Path(cli.env["RAYTRAIN_HOME"]) / ray_process.RECORDS["head"]).read_text())
    dashboard = Dashboard(record["dashboard_url"], token_headers(Path(record["token_path"]).read_text().strip()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in dashboard.get("/api/jobs/", timeout=15):
            if job.get("submission_id") == job_id and (job.get("driver_info") or {}).get("pid"):
                return int(job["driver_info"]["pid"])
        time.sleep(0.5)
    raise AssertionError(f"no driver pid for {job_id} after {timeout} s")


def test_sigterm_to_the_driver_commits_the_step_in_progress_and_resume_continues_after_it(cli, gpt_baseline, tmp_path):
    """Not `jobs stop` (Ray's stop SIGKILLs the driver 3 s after its SIGTERM): a plain SIGTERM to the driver, as
    a pod eviction or a shutdown sends. The job ends stopped with the step in progress committed; --resume
    continues after it and ends with the weights of an uninterrupted run."""
    base, _, _ = gpt_baseline
    proc = cli("submit", JOBS / "gpt_zero.py", *FLAGS, "--no-wait", "--json", "--",
               "--steps", "10", "--preempt-handshake", f"{tmp_path}:5", check=True)
    run = json.loads(proc.stdout)["id"]
    deadline = time.monotonic() + 400
    while not (tmp_path / "rank-1.json").exists():
        assert time.monotonic() < deadline, "no handshake after 400 s"
        time.sleep(0.2)
    os.kill(driver_pid(cli, run), signal.SIGTERM)  # every rank waits after step 5 until it has the notice
    deadline = time.monotonic() + 180
    while (status := cli.json("jobs", "status", run))["state"] not in ("stopped", "failed", "succeeded"):
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status["state"] == "stopped", status
    facts = cli.facts(run)
    (preempted,) = facts.preempted
    assert preempted["message"].startswith("preempted: driver SIGTERM on rank "), preempted
    assert preempted["saved"] is True and preempted["step"] == 6, preempted  # the step in progress
    assert facts.stopped["checkpoint_step"] == 6 and f"--resume {run}" in facts.stopped["message"], facts.stopped
    assert facts.error is None and facts.finished is None
    assert [m["step"] for m in facts.metrics] == list(range(1, 7))
    listed = json.loads(cli("jobs", "checkpoints", run, "--json", check=True).stdout)
    assert [c["step"] for c in listed] == [6] and listed[0]["complete"], listed

    info = submit_json(cli, JOBS / "gpt_zero.py", [*FLAGS, "--resume", run], ["--steps", "10"])
    resumed = cli.facts(info["id"])
    assert resumed.started["resume_from"] == listed[0]["path"]
    assert [m["step"] for m in resumed.metrics] == list(range(7, 11))  # nothing lost, nothing redone
    assert_same_weights(cli, info["id"], base["id"], tmp_path)
