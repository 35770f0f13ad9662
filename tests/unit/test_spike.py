"""The guard's additions (issue 37): --spike-guard's rule, the rows a skip message names, ctx.dataset's row ids
and the rows a rollback drops (raytrain.runtime.datasets.batches, with the in-memory source of test_data_shards), the
rollback failure policy's decisions (Ray Train's own policy and errors), and the flags' checks."""
import numpy as np
import pytest

from raytrain.errors import ConfigError
from raytrain.runtime.worker import guard, rollback
from raytrain.runtime.datasets.batches import Position, ShardBatches
from raytrain.runtime.datasets.feed import BlockSource


# -- the spike rule ---------------------------------------------------------------------------------------
def test_no_spike_during_the_warm_up():
    rule = guard.SpikeRule()
    for _ in range(rule.WARMUP - 1):
        rule.add(1.0)
    assert rule.check(1e6) is None
    rule.add(1.0)
    assert rule.check(1e6) is not None


def test_a_spike_is_above_mean_plus_six_std_of_the_window():
    rule = guard.SpikeRule([1.0, 3.0] * 10)  # mean 2, std 1: the limit is 8
    assert rule.check(7.99) is None
    said = rule.check(8.01)
    assert said == "loss spike 8.01 (above 8: mean 2 + 6 x std 1 of the last 20 good steps)", said
    assert rule.check(float("inf")) is None  # the non-finite guard's, not a spike


def test_the_std_is_floored_so_a_flat_loss_does_not_make_noise_a_spike():
    rule = guard.SpikeRule([2.0] * 30)  # std 0: the floor 1% of the mean -> limit 2 + 6 x 0.02
    assert rule.check(2.1) is None and rule.check(2.13) is not None


def test_the_window_keeps_the_last_50_good_steps():
    rule = guard.SpikeRule([100.0] * 10 + [1.0] * 50)
    assert list(rule.losses) == [1.0] * 50 and rule.check(1.2) is not None


def test_only_good_steps_enter_the_window():
    """A step the guard skips (non-finite, or a spike) is not added: the window is not dragged up by the spike."""
    class Engine:
        global_steps, skipped_steps, lr_scheduler, optimizer = 0, 0, None, None
        module = __import__("torch").nn.Linear(1, 1)

        def backward(self, loss):
            pass

        def _take_model_step(self):
            self.global_steps += 1

    engine = Engine()
    emitted = []
    g = guard.StepGuard(engine, rank=0, world_size=1, emit=lambda kind, **d: emitted.append(d)).install()
    g.configure(spike=guard.SpikeRule([1.0] * 20))
    for loss in (1.0, 50.0, 1.0):
        engine.backward(__import__("torch").tensor(loss))
        engine._take_model_step()
    assert list(g.spike.losses) == [1.0] * 22, list(g.spike.losses)
    assert [e["step"] for e in emitted] == [2] and emitted[0]["message"].startswith("step 2 skipped: loss spike 50")
    assert emitted[0]["spike"] == 50.0


def fake_engine(fp16=False):
    import torch

    class Engine:
        global_steps, skipped_steps, lr_scheduler, optimizer = 0, 0, None, None
        module = torch.nn.Linear(1, 1)

        def fp16_enabled(self):
            return fp16

        def backward(self, loss):
            pass

        def _take_model_step(self):
            self.global_steps += 1

    return Engine()


def steps(engine, losses):
    import torch

    for loss in losses:
        engine.backward(torch.tensor(loss))
        engine._take_model_step()


def test_k_bad_steps_in_a_row_roll_back_with_every_step_rows():
    engine, calls = fake_engine(), []
    g = guard.StepGuard(engine, rank=0, world_size=1, emit=lambda kind, **d: None).install()
    served = iter([[("train", 0, [2 * s, 2 * s + 1])] for s in range(10)])
    g.configure(rows=lambda: next(served), rollback_after=2, on_rollback=calls.append)
    nan = float("nan")
    steps(engine, [1.0, nan, 1.0, nan])  # never two in a row
    assert calls == []
    steps(engine, [nan])
    (run,) = calls
    assert [b["step"] for b in run] == [4, 5] and run[0]["rows"] == {"train": {"0": [6, 7]}}, run
    assert run[1]["message"] == "step 5 skipped: non-finite loss on rank 0 (rows 8, 9)"
    assert g.bad_run == []  # counted afresh


def test_fp16_loss_scale_overflows_do_not_count_toward_a_rollback():
    engine, calls = fake_engine(fp16=True), []
    g = guard.StepGuard(engine, rank=0, world_size=1, emit=lambda kind, **d: None).install()
    g.configure(rollback_after=1, on_rollback=calls.append)
    g._record(1, [guard.GRADIENTS], [])  # gradients alone: the loss scale's overflow
    assert calls == []
    g._record(2, [guard.LOSS], [])
    assert len(calls) == 1


# -- the rows in the message ------------------------------------------------------------------------------
def test_the_skip_message_names_the_rows_of_the_bad_ranks():
    rows = {0: {"train": [10, 11]}, 1: {"train": [1235, 1234]}}
    assert guard.describe(6, [0, guard.LOSS], rows) == "step 6 skipped: non-finite loss on rank 1 (rows 1234, 1235)"
    assert guard.describe(6, [0, 0], rows, spike="loss spike 9") == (
        "step 6 skipped: loss spike 9 (rows 10, 11, 1234, 1235)")  # a spike is the whole global batch's
    two = {1: {"train": [3], "eval": [4]}}
    assert guard.describe(2, [0, guard.LOSS], two) == (
        "step 2 skipped: non-finite loss on rank 1 (train rows 3; eval rows 4)")
    many = {1: {"train": list(range(20))}}
    assert guard.describe(2, [0, guard.LOSS], many).endswith("(rows 0, 1, 2, 3, 4, 5, 6, 7 and 12 more)")
    assert guard.describe(6, [0, guard.LOSS]) == "step 6 skipped: non-finite loss on rank 1"  # no ctx.dataset


# -- row ids and dropped rows in ctx.dataset ---------------------------------------------------------------
class Ids(BlockSource):
    """The given row ids, in blocks of ``block`` rows; each row's ``id`` column is its id, ``x`` follows it."""

    def __init__(self, ids, block=50):
        super().__init__()
        self.ids = list(ids)
        self._add([((a, min(a + block, len(self.ids))), 0, None, min(block, len(self.ids) - a))
                   for a in range(0, len(self.ids), block)])
        self.done = True

    def _fetch(self, entry):
        (a, b), _, _, _ = entry
        ids = np.asarray(self.ids[a:b])
        return {"id": ids, "x": ids.astype(np.float32) * 2}, 16 * (b - a)


def run(ids, size, batch, position=None, drop=None, steps=None, shuffle=False):
    """Every rank's batches (their ``id`` columns and the row ids on_batch got), consumed in lockstep."""
    got = [[] for _ in range(size)]
    seen = [[] for _ in range(size)]
    positions = [Position(**(position or Position()).to_dict()) for _ in range(size)]
    its = [iter(ShardBatches(Ids(ids), rank=r, size=size, batch_size=batch, position=positions[r], prefetch=0,
                             shuffle=shuffle, seed=3, shuffle_window=7, drop=drop,
                             on_batch=lambda epoch, rows, r=r: seen[r].append((epoch, rows))))
           for r in range(size)]
    while steps is None or len(got[0]) < steps:
        batches = [next(it, None) for it in its]
        if all(b is None for b in batches):
            break
        assert all(b is not None for b in batches), "ranks out of lockstep"
        for r, b in enumerate(batches):
            got[r].append(b["id"].tolist())
    return got, seen, positions


def test_each_batch_comes_with_its_dataset_row_ids():
    got, seen, _ = run(range(40), 2, 4, shuffle=True)
    for r in range(2):
        assert [rows for _, rows in seen[r]] == got[r]
        assert all(epoch == 0 for epoch, _ in seen[r])


def test_a_rollback_drops_exactly_the_bad_step_rows_and_equals_a_dataset_without_them():
    ids, size, batch = list(range(120)), 2, 2
    full, _, _ = run(ids, size, batch)
    bad_step = 24  # 0-based: the rows of the 25th step on both ranks
    bad = sorted(full[0][bad_step] + full[1][bad_step])
    # back at a checkpoint after 20 steps: restored there, the bad rows dropped where they come
    _, _, at20 = run(ids, size, batch, steps=20)
    after, _, _ = run(ids, size, batch, position=at20[0], drop={0: bad})
    for r in range(size):
        assert full[r][:20] + after[r] == full[r][:bad_step] + full[r][bad_step + 1:]
    # the same as a dataset that never had those rows (the epoch is split into contiguous chunks here)
    omitted, _, _ = run([i for i in ids if i not in bad], size, batch)
    assert [full[r][:20] + after[r] for r in range(size)] == omitted


def test_a_position_saved_after_dropped_rows_counts_them_as_read():
    ids, size, batch = list(range(60)), 2, 2
    full, _, _ = run(ids, size, batch)
    bad = sorted(full[0][3] + full[1][3])
    first, _, pos = run(ids, size, batch, drop={0: bad}, steps=5)  # past the dropped rows
    rest, _, _ = run(ids, size, batch, position=pos[0], drop={0: bad})
    for r in range(size):
        assert first[r] + rest[r] == full[r][:3] + full[r][4:]


# -- the rollback policy ------------------------------------------------------------------------------------
def group_error(**failures):
    from ray.train.v2.api.exceptions import WorkerGroupError

    return WorkerGroupError("workers failed", {int(r[1:]): exc for r, exc in failures.items()})


def policy_of(max_rollbacks, config):
    """The policy Ray Train creates inside rollback.installed (through ray_tuning.ray_access)."""
    import ray.train.v2.api.data_parallel_trainer as dpt

    with rollback.installed(max_rollbacks):
        return dpt.create_failure_policy(config)


def test_a_rollback_is_retried_without_counting_a_failure_and_capped():
    from ray.train import FailureConfig
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    policy = policy_of(2, FailureConfig(max_failures=0))
    back = group_error(r0=rollback.Rollback("rollback 1"), r1=rollback.Rollback("rollback 1"))
    assert policy.make_decision(back) == FailureDecision.RETRY
    assert policy.make_decision(back) == FailureDecision.RETRY
    assert policy.make_decision(back) == FailureDecision.RAISE  # the policy's own cap, past --max-rollbacks
    policy = policy_of(2, FailureConfig(max_failures=0))
    assert policy.make_decision(group_error(r0=rollback.RollbackLimit("3 bad steps"))) == FailureDecision.RAISE
    assert policy.make_decision(group_error(r1=RuntimeError("crash"))) == FailureDecision.RAISE  # --max-failures 0
    policy = policy_of(2, FailureConfig(max_failures=1))
    assert policy.make_decision(group_error(r1=RuntimeError("crash"))) == FailureDecision.RETRY


def test_a_rollback_is_known_through_the_errors_ray_wraps_it_in():
    wrapped = RuntimeError(f"ray.exceptions.RayTaskError: Traceback ...\n{rollback.__name__}.Rollback: back")
    assert rollback.kind_of(wrapped) == "Rollback"
    outer = RuntimeError("outer")
    outer.__cause__ = rollback.RollbackLimit("x")
    assert rollback.kind_of(outer) == "RollbackLimit"
    assert rollback.group_kind(group_error(r0=rollback.Rollback("a"), r1=RuntimeError("crash"))) is None


def test_merge_rows():
    into = {"train": {"0": [3, 5]}}
    rollback.merge_rows(into, {"train": {"0": [4, 3], "1": [9]}, "eval": {"0": [1]}})
    assert into == {"train": {"0": [3, 4, 5], "1": [9]}, "eval": {"0": [1]}}


# -- the flags ----------------------------------------------------------------------------------------------
def test_flags(tmp_path):
    from raytrain.config.options import Options
    from raytrain.config.resolve import resolve

    job = tmp_path / "job.py"
    job.write_text("def train(ctx):\n    pass\n")
    plan = resolve(Options(job=str(job)))
    assert (plan.spike_guard, plan.rollback_after, plan.max_rollbacks) == (False, 3, 3)
    plan = resolve(Options(job=str(job), spike_guard=True, rollback_after=0, max_rollbacks=5))
    assert (plan.spike_guard, plan.rollback_after, plan.max_rollbacks) == (True, 0, 5)
    assert type(plan).from_dict(plan.to_dict()).rollback_after == 0  # travels in the plan
    with pytest.raises(ConfigError, match="--rollback-after -1: must be an integer >= 0") as e:
        resolve(Options(job=str(job), rollback_after=-1))
    assert e.value.flag == "--rollback-after"
    with pytest.raises(ConfigError, match="--max-rollbacks -2"):
        resolve(Options(job=str(job), max_rollbacks=-2))


def test_the_flags_parse(tmp_path):
    from click.testing import CliRunner

    from raytrain.cli.main import main as cli

    job = tmp_path / "job.py"
    job.write_text("def train(ctx):\n    pass\n")
    out = CliRunner().invoke(cli, ["submit", str(job), "--spike-guard", "--rollback-after", "1", "--max-rollbacks",
                                   "2", "--dry-run", "--json"])
    assert out.exit_code == 0, out.output
    assert '"spike_guard": true' in out.output and '"rollback_after": 1' in out.output, out.output[-2000:]
    bad = CliRunner().invoke(cli, ["submit", str(job), "--rollback-after", "-1", "--dry-run"])
    assert bad.exit_code == 2 and "--rollback-after -1" in bad.output, bad.output
