"""A preemption through Ray's own drain API on two real nodes: `ray drain-node` with a deadline on the node of
a worker mid-run commits a checkpoint at the step in progress (--checkpoint-every is far beyond the run); the
node then goes away and a fresh one takes its place (as a spot replacement would), the group restarts from
that checkpoint, and the run ends with the weights of an uninterrupted run."""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.multinode

GPT = JOBS / "gpt_zero.py"
FLAGS = ["--workers", "2", "--placement", "spread", "--zero", "3", "--precision", "fp32", "--micro-batch", "2",
         "--grad-accum", "2", "--checkpoint-every", "1000"]


def _wait(what, ok, thread, timeout_s=400):
    deadline = time.monotonic() + timeout_s
    while not (value := ok()):
        assert thread.is_alive(), f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.5)
    return value


def test_a_drained_node_commits_the_step_in_progress_and_the_run_resumes_from_it(two_nodes, tmp_path):
    cli, shared = two_nodes.cli, two_nodes.shared_dir
    flags = [*FLAGS, "--storage", shared]
    base = cli("submit", GPT, *flags, "--json", "--", "--steps", "10", timeout=600)
    assert base.returncode == 0, base.stdout + base.stderr
    base = json.loads(base.stdout)

    handshake = Path(shared) / f"handshake-{time.time_ns()}"
    handshake.mkdir()
    out = {}
    thread = threading.Thread(target=lambda: out.update(proc=cli(
        "submit", GPT, *flags, "--max-failures", "1", "--json", "--", "--steps", "10",
        "--preempt-handshake", f"{handshake}:5", timeout=900)), daemon=True)
    thread.start()
    ranks = [_wait(f"rank {r}'s handshake", lambda r=r: _read(handshake / f"rank-{r}.json"), thread) for r in (0, 1)]
    on_node2 = next(r for r in ranks if r["ip"] == two_nodes.node2_ip)
    # Ray's CLI, as an operator or an autoscaler would drain a node about to be preempted
    drained = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "drain-node", "--address", two_nodes.gcs_address,
         "--node-id", on_node2["node_id"], "--reason", "DRAIN_NODE_REASON_PREEMPTION",
         "--reason-message", "spot preemption (test)", "--deadline-remaining-seconds", "300"],
        env=two_nodes.ray_env(), capture_output=True, text=True, timeout=120)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    # the rank on node 2 got the notice; the checkpoint of the step in progress is committed before the group
    # restarts; then node 2 goes away and a fresh node joins in its place
    notice = _wait("notice", lambda: _text(handshake / "notice"), thread)
    assert notice.startswith(f"rank {on_node2['rank']}: node drain"), notice
    job = cli.json("jobs", "list", timeout=60)[0]["id"]  # newest first: this run
    _wait("preempted event", lambda: cli.facts(job).preempted, thread)
    two_nodes.kill_node2()
    two_nodes.wait_alive({two_nodes.head_ip})
    two_nodes.start_node2()
    thread.join(timeout=900)
    proc = out["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    facts = cli.facts(info["id"])
    assert info["state"] == "succeeded" and info["restarts"] == 1, info
    (preempted,) = facts.preempted
    assert preempted["message"].startswith(
        f"preempted: node drain on rank {on_node2['rank']} (node {two_nodes.node2_ip})"), preempted
    assert preempted["saved"] is True and preempted["step"] == 6 and 0 < preempted["deadline_s"] <= 300, preempted
    assert facts.checkpoints == [6, 10], (facts.checkpoints, _warnings(cli, info["id"]))
    steps = [m["step"] for m in facts.metrics]
    assert sorted(set(steps)) == list(range(1, 11)) and len(steps) - len(set(steps)) <= 1, steps
    assert_same_weights(cli, shared, info["id"], base["id"], tmp_path)


def _warnings(cli, job):
    """The job's warning lines (e.g. the driver's, that a rank's last lines did not reach the log)."""
    return [line for line in cli("jobs", "logs", job, "-v").stdout.splitlines() if "warning" in line]


def assert_same_weights(cli, storage, run, base_run, tmp_path):
    """Both runs' last checkpoints, exported (the fp32 weights), equal to the rounding tests/e2e's
    test_checkpoints.py explains (a restore that lost state moves most weights by 1e-3)."""
    import torch

    exported = []
    for job in (run, base_run):
        out = tmp_path / f"{job}.pt"
        done = cli("export", job, "--storage", storage, "--out", out, "--json", check=True)
        assert json.loads(done.stdout)["step"] == 10
        exported.append(torch.load(out))
    mine, theirs = exported
    assert mine.keys() == theirs.keys()
    for key in mine:
        torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=2e-4, msg=key)


def _read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(path):
    try:
        return path.read_text()
    except OSError:
        return None
