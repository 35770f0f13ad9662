"""--checkpoint-mode async on the real local cluster (docs/checkpoints.md): the same losses and parameters as
sync saves, a worker SIGKILLed while its upload is in flight restarts from the last committed checkpoint (and
with --keep the restart removes the uncommitted folder), a
save waits for the one in flight and says how long, the job's end waits for the last one, and only committed
checkpoints are listed or resumed from."""
import json

import pytest
import torch

from tests.e2e.conftest import submit_json

pytestmark = pytest.mark.e2e

JOB = __import__("pathlib").Path(__file__).parent / "jobs" / "ckpt_async.py"
Z3 = ["--workers", "2", "--zero", "3", "--precision", "fp32", "--micro-batch", "4", "--checkpoint-every", "2"]


def run(cli, flags, job_args, tmp_path, name, **kw):
    out = tmp_path / f"{name}.pt"
    info = submit_json(cli, JOB, flags, [*job_args, "--params-out", out], timeout=600, **kw)
    return info, cli.facts(info["id"]), torch.load(out)


def assert_same_params(mine, theirs):
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key  # bit for bit


def rank_log(cli, job, rank):
    return cli("jobs", "logs", job, "--rank", str(rank), check=True).stdout


@pytest.fixture(scope="module")
def z3_sync(e2e_env, tmp_path_factory):
    """An uninterrupted ZeRO-3 run of 6 steps with sync saves (checkpoints [2, 4, 6]): the run the module's
    ZeRO-3 async runs are compared with."""
    e2e_env("cluster", "up", "--num-cpus", "2", check=True, timeout=180)
    return run(e2e_env, [*Z3, "--checkpoint-mode", "sync"], ["--steps", "6"], tmp_path_factory.mktemp("z3"), "sync")


def test_a_worker_killed_mid_upload_restarts_from_the_last_committed_checkpoint(cli, z3_sync, tmp_path):
    _, base, base_params = z3_sync
    assert base.checkpoints == [2, 4, 6]
    info, facts, params = run(cli, [*Z3, "--checkpoint-mode", "async", "--max-failures", "1", "--keep", "3"],
                              ["--steps", "6", "--sigkill-at-step", "5", "--hold-upload-step", "4"], tmp_path, "async")
    assert info["state"] == "succeeded" and info["restarts"] == 1, info
    rank1 = rank_log(cli, info["id"], 1)
    assert "rank 1: SIGKILL while the checkpoint of step 4 is uploading" in rank1, rank1[-3000:]
    steps = [m["step"] for m in facts.metrics]
    assert steps[-4:] == [3, 4, 5, 6] and steps[:5] == list(range(1, 6)), steps  # resumed from step 2
    rank0 = rank_log(cli, info["id"], 0)
    assert "raytrain: restored step 2 from" in rank0
    # step 4's first save never committed: rank 0 did not announce it; the restart saved 4 again, then 6
    assert facts.checkpoints == [2, 4, 6], facts.checkpoints
    # and with --keep the restart removed its folder (Ray Train's retention counts registered ones only)
    removed = [line for line in rank0.splitlines() if "raytrain: --keep 3: removed the uncommitted checkpoint" in line]
    assert len(removed) == 1 and "(step 4, rank 1 " in removed[0], rank0[-3000:]
    committed = json.loads(cli("jobs", "checkpoints", info["id"], "--json", check=True).stdout)
    assert [c["step"] for c in committed] == [2, 4, 6] and all(c["complete"] for c in committed), committed
    assert removed[0].split("checkpoint ")[1].split(" (")[0] not in [c["path"] for c in committed]
    every = json.loads(cli("jobs", "checkpoints", info["id"], "--json", "--all", check=True).stdout)
    assert every == committed, every
    # and a --resume of the run picks its latest committed checkpoint
    from raytrain.checkpoints import store

    assert store.resolve_resume(str(__import__("pathlib").Path(committed[0]["path"]).parent), None).step == 6
    # the same run as the uninterrupted sync one
    by_step = {m["step"]: m["loss"] for m in facts.metrics[-4:]}
    assert [by_step[s] for s in range(3, 7)] == base.losses[2:], (facts.losses, base.losses)
    assert_same_params(params, base_params)


def test_async_and_sync_saves_agree_and_async_waits_are_reported(cli, z3_sync, tmp_path):
    """ZeRO-3. The async run's step-2 upload is held 6 s, so step 4's save waits for it; step 6's (the last)
    is held 4 s, so the job's end waits for it. Both say so; nothing else differs from sync saves."""
    sync_info, sync, sync_params = z3_sync
    info, facts, params = run(cli, Z3, ["--steps", "6", "--slow-upload", "2:6", "--slow-upload", "6:4"], tmp_path,
                              "a")  # async: the default for a train(ctx) job
    assert facts.started["checkpoint_mode"] == "async" and sync.started["checkpoint_mode"] == "sync"
    assert facts.losses == sync.losses
    assert_same_params(params, sync_params)
    assert facts.checkpoints == sync.checkpoints == [2, 4, 6]
    for rank in (0, 1):
        log = rank_log(cli, info["id"], rank)
        assert f"raytrain: rank {rank}: the checkpoint of step 4 waited" in log and "for step 2's save" in log, log
    log0 = rank_log(cli, info["id"], 0)
    end = [line for line in log0.splitlines() if "the job's end waited" in line]
    assert len(end) == 1 and "checkpoint of step 6" in end[0], log0[-3000:]
    assert float(end[0].split("waited ")[1].split(" s")[0]) > 2.0, end  # it did wait for the held upload
    listed = json.loads(cli("jobs", "checkpoints", info["id"], "--json", "--all", check=True).stdout)
    assert [c["step"] for c in listed] == [2, 4, 6] and all(c["complete"] for c in listed), listed
    # jobs status: each save's costs
    status = json.loads(cli("jobs", "status", info["id"], "--json", check=True).stdout)
    rows = {r["step"]: r for r in status["checkpoint_timings"]}
    assert sorted(rows) == [2, 4, 6] and all(r["mode"] == "async" for r in rows.values()), rows
    for r in rows.values():
        assert {"stall_s", "snapshot_s", "write_s", "upload_s"} <= set(r) and r["stall_s"] >= r["snapshot_s"] > 0, r
    assert rows[2]["stall_s"] < 5.0, rows[2]  # its write was held 6 s on the upload thread, not on the step
    assert rows[4]["wait_s"] > 1.0, rows[4]  # step 4's save waited for step 2's
    text = cli("jobs", "status", info["id"], check=True).stdout
    assert "ckpt      step 6 (async): stall " in text and "snapshot" in text and "(3 committed)" in text, text
    sync_rows = json.loads(cli("jobs", "status", sync_info["id"], "--json", check=True).stdout)["checkpoint_timings"]
    assert [(r["step"], r["mode"]) for r in sync_rows] == [(2, "sync"), (4, "sync"), (6, "sync")], sync_rows
    assert all(r["stall_s"] > 0 for r in sync_rows), sync_rows


def test_async_saves_under_a_pipeline_agree_with_sync(cli):
    """--pp 2: each stage's layer files go through the snapshot too; the same losses and final probe loss."""
    layouts = __import__("pathlib").Path(__file__).parent / "jobs" / "layouts.py"
    flags = ["--workers", "2", "--pp", "2", "--micro-batch", "4", "--grad-accum", "2", "--checkpoint-every", "2"]
    runs = {}
    for mode in ("sync", "async"):
        info = submit_json(cli, layouts, [*flags, "--checkpoint-mode", mode], ["--steps", "6"], timeout=420)
        facts = cli.facts(info["id"])
        listed = json.loads(cli("jobs", "checkpoints", info["id"], "--json", check=True).stdout)
        assert [c["step"] for c in listed] == [2, 4, 6] and facts.checkpoints == [2, 4, 6], (mode, listed)
        runs[mode] = ([m["loss"] for m in facts.metrics], facts.metrics[-1]["probe_loss"])
    assert runs["async"] == runs["sync"]


@pytest.mark.parametrize("layout", [
    ["--zero", "3", "--offload", "optimizer"],  # ZeRO-3 shards, the optimizer's state in host memory
    ["--zero", "1", "--tp", "2"],  # AutoTP: each rank's slice of every split layer
], ids=["zero3-offload", "tp2"])
def test_a_restart_from_an_async_checkpoint_agrees_with_sync_saves(cli, tmp_path, layout):
    """Step 2's async save is written 4 s late, while step 3 trains (and changes every tensor it copied); then a
    rank crashes and the group restarts from that checkpoint. The losses and the final parameters are those of
    an uninterrupted run with sync saves: the snapshot, not the live state, is what was written."""
    flags = ["--workers", "2", "--precision", "fp32", "--micro-batch", "4", "--checkpoint-every", "2", *layout]
    _, sync, sync_params = run(cli, [*flags, "--checkpoint-mode", "sync"], ["--steps", "5"], tmp_path, "sync")
    info, facts, params = run(cli, [*flags, "--checkpoint-mode", "async", "--max-failures", "1"],
                              ["--steps", "5", "--slow-upload", "2:4", "--crash-after-step", "3"], tmp_path, "async")
    assert info["state"] == "succeeded" and info["restarts"] == 1, info
    assert facts.started["checkpoint_mode"] == "async" and sync.started["checkpoint_mode"] == "sync"
    assert "raytrain: restored step 2 from" in rank_log(cli, info["id"], 0)
    steps = [m["step"] for m in facts.metrics]
    assert steps == [1, 2, 3, 3, 4, 5], steps  # step 3 redone after the restart from step 2
    by_step = {m["step"]: m["loss"] for m in facts.metrics}  # the restart's (the later) losses
    assert [by_step[s] for s in range(1, 6)] == sync.losses, (facts.losses, sync.losses)
    assert_same_params(params, sync_params)
    listed = json.loads(cli("jobs", "status", info["id"], "--json", check=True).stdout)["checkpoint_timings"]
    assert {r["mode"] for r in listed} == {"async"}, listed
