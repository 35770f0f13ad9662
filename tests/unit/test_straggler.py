"""The straggler rule (raytrain.straggler), the compute timing on a worker (raytrain.runtime.worker.heartbeat,
raytrain.runtime.worker.collective_time) and how status and progress show a straggler."""
import json
import random
from pathlib import Path

from raytrain import events, straggler
from raytrain.cli.progress import describe_stragglers

RECORDED = Path(__file__).parent / "data" / "straggler_clean_500.json"


def feed(detector, per_rank, steps):
    out = []
    for step in steps:
        out += detector.update([{"rank": r, "node": f"10.0.0.{r}", "compute": [[step, f(step)]]}
                                for r, f in per_rank.items()])
    return out


def test_a_rank_2x_slower_is_named_with_its_node_once_and_clears_when_it_recovers():
    d = straggler.Detector()
    slow = {0: lambda s: 0.05, 1: lambda s: 0.10 if 30 <= s < 60 else 0.05, 2: lambda s: 0.052}
    changes = feed(d, slow, range(1, 100))
    assert [(c["rank"], c["state"]) for c in changes] == [(1, "slow"), (1, "recovered")]
    raised, cleared = changes
    assert raised["node"] == "10.0.0.1" and 1.9 < raised["ratio"] <= 2.0 and raised["since_step"] <= 30 + 20
    assert "rank 1 (10.0.0.1) is a straggler" in raised["message"] and "8 of the last 10" in raised["message"]
    assert 60 < cleared["step"] < 70 and "recovered" in cleared["message"]


def test_warm_up_steps_are_not_judged():
    # a rank slow in its first 20 steps only (uneven warm-up), then even: no alarm
    assert feed(straggler.Detector(), {0: lambda s: 0.05, 1: lambda s: 0.2 if s <= 20 else 0.05}, range(1, 80)) == []
    # counted from the first step the detector saw (a run resumed at step 500)
    assert feed(straggler.Detector(), {0: lambda s: 0.05, 1: lambda s: 0.2 if s <= 520 else 0.05},
                range(501, 580)) == []


def test_the_rule_needs_8_of_10_steps_a_ratio_of_1_5_and_10_ms():
    # slow in 7 of every 10 steps: never a straggler
    assert feed(straggler.Detector(), {0: lambda s: 0.05, 1: lambda s: 0.1 if s % 10 < 7 else 0.05}, range(1, 100)) == []
    # 1.4x: not enough
    assert feed(straggler.Detector(), {0: lambda s: 0.05, 1: lambda s: 0.07}, range(1, 60)) == []
    # 2x of a millisecond step: scheduler noise, not a straggler
    assert feed(straggler.Detector(), {0: lambda s: 0.002, 1: lambda s: 0.004}, range(1, 60)) == []
    # one rank alone: nothing to compare
    assert feed(straggler.Detector(), {0: lambda s: 0.05}, range(1, 60)) == []


def test_beats_that_arrive_apart_are_aligned_by_step():
    d = straggler.Detector()
    history = {0: [[s, 0.05] for s in range(1, 200)], 1: [[s, 0.12] for s in range(1, 200)]}
    assert d.update([{"rank": 0, "compute": history[0][:150]}]) == []
    assert d.update([{"rank": 1, "compute": history[1][:120]}])[0]["rank"] == 1  # steps 111-120 in common


def test_a_restart_ends_the_episode():
    d = straggler.Detector()
    feed(d, {0: lambda s: 0.05, 1: lambda s: 0.2}, range(1, 40))
    assert d.active and [c["state"] for c in d.reset()] == ["recovered"] and not d.active


def test_many_ranks_use_everyones_median():
    ranks = {r: (lambda s: 0.05) for r in range(64)}
    ranks[17] = lambda s: 0.2
    changes = feed(straggler.Detector(), ranks, range(1, 35))
    assert [(c["rank"], c["state"]) for c in changes] == [(17, "slow")]


def test_recorded_clean_run_of_500_steps_gives_no_alarm():
    """Real compute times of 2 CPU workers (tests/e2e/jobs/straggler.py --steps 500 --work-ms 30, gloo, ZeRO-0),
    replayed step by step; also with every step's timings shuffled between the ranks."""
    recorded = {int(r): v for r, v in json.loads(RECORDED.read_text()).items()}
    assert sorted(recorded) == [0, 1] and min(len(v) for v in recorded.values()) >= 490
    d = straggler.Detector()
    for step in sorted({s for v in recorded.values() for s, _ in v}):
        assert d.update([{"rank": r, "compute": [c for c in v if c[0] == step]} for r, v in recorded.items()]) == []
    rng = random.Random(0)
    d = straggler.Detector()
    steps = {r: dict(map(tuple, v)) for r, v in recorded.items()}
    for step in sorted(set(steps[0]) & set(steps[1])):
        pair = [steps[0][step], steps[1][step]]
        rng.shuffle(pair)
        assert d.update([{"rank": r, "compute": [[step, pair[r]]]} for r in (0, 1)]) == []


def test_a_workers_compute_time_leaves_out_collective_waits_and_checkpoints(monkeypatch):
    from raytrain.runtime.worker import collective_time, heartbeat

    clock = [100.0]
    monkeypatch.setattr(heartbeat.time, "time", lambda: clock[0])
    waited = [0.0]
    monkeypatch.setattr(collective_time, "seconds", lambda: waited[0])
    monkeypatch.setattr(collective_time, "install", lambda: True)
    state = heartbeat.State()
    state.time_compute()
    state.step_finished(1)
    clock[0] += 1.0  # a step of 1 s, 0.6 s of it waiting in a collective
    waited[0] += 0.6
    state.step_finished(2)
    state.enter("checkpoint")  # 2 s of checkpoint (0.5 s of it in a barrier), then 0.3 s of work
    clock[0] += 2.0
    waited[0] += 0.5
    state.enter("data")
    clock[0] += 0.3
    state.step_finished(3)
    clock[0] += 1.0  # a report every 2 steps: per-step time
    state.step_finished(5)
    assert [(s, round(c, 6)) for s, c in state.compute] == [(2, 0.4), (3, 0.3), (5, 0.5)]
    assert state.snapshot()["compute"] == list(state.compute)
    assert "compute" not in heartbeat.State().snapshot()  # timing off (--hang-timeout 0): nothing measured


def test_collective_time_counts_the_time_inside_work_wait():
    import os

    import torch
    import torch.distributed as dist

    from raytrain.runtime.worker import collective_time

    assert collective_time.install()
    before = collective_time.seconds()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(__import__("tests.conftest", fromlist=["free_port"]).free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    finally:
        dist.destroy_process_group()
    assert collective_time.seconds() > before


def test_status_and_the_progress_line_name_a_straggler_until_it_recovers():
    facts = events.JobFacts()
    raised = {"event": events.STRAGGLER, "state": "slow", "rank": 1, "node": "10.0.0.2", "ratio": 2.1,
              "message": "rank 1 (10.0.0.2) is a straggler: compute 2.1x the other ranks' in 9 of the last 10 steps"}
    facts.add(raised)
    assert facts.warnings() == [f"straggler: {raised['message']}"]
    assert describe_stragglers(facts) == "  straggler: rank 1 (10.0.0.2) 2.1x"
    facts.add({"event": events.STRAGGLER, "state": "recovered", "rank": 1, "message": "rank 1 recovered"})
    assert facts.warnings() == [] and describe_stragglers(facts) == ""


def test_the_board_passes_a_straggler_to_rank_0s_trackers():
    from raytrain.runtime.driver.hang_watch import Board

    board = Board()
    assert "straggler" not in board.beat({"rank": 0, "pid": 1})
    board.straggling({"state": "slow", "rank": 1, "message": "m"})
    board.straggling({"state": "recovered", "rank": 1, "message": "r"})
    reply = board.beat({"rank": 0, "pid": 1})
    assert reply["straggler"]["seq"] == 2 and reply["straggler"]["state"] == "recovered"
