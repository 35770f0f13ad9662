"""bench/guards_inproc.py (overhead.py --guards-ab --same-processes): the median's confidence interval, and a
small real run (two gloo processes, real engines) whose figures are all there: the pairs of both build
orders, the guards' own timed seconds, the phase marks seen once per step. --same-engine: a small real run
(one engine per process, the toggle checked on it), and the toggle on a stand-in engine (no DeepSpeed): off
is the plain engine, on skips a NaN loss's step, for each component subset."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import guards_inproc  # noqa: E402


def test_the_median_interval_is_the_order_statistics_a_binomial_allows():
    # n = 10: P(Bin(10, 1/2) < 2) = 11/1024 <= 2.5 % < P(< 3) = 56/1024: the 2nd and the 9th value
    assert guards_inproc.median_ci([float(v) for v in range(10, 0, -1)]) == (2.0, 9.0)
    assert guards_inproc.median_ci([1.0, 2.0, 3.0]) == (None, None)  # too few for 95 %


@pytest.mark.timeout(300)
def test_a_small_run_reports_the_ab_and_the_guards_own_time():
    r = guards_inproc.measure(zero=1, steps=2, rounds=2, dim=16, layers=1, batch=4)
    assert set(r["orders"]) == {"plain-first", "guarded-first"} and len(r["round_ratios"]) == 4
    assert all(v > 0 for v in r["round_ratios"])
    g = r["guard_time"]
    assert g["nonfinite_guard_ms"] > 0 and g["total_ms"] >= g["nonfinite_guard_ms"]
    assert g["timed_waits_per_step"] >= 1  # ZeRO-1's step waits in collectives: each timed
    assert r["guard_ratio"] == pytest.approx(1 + g["fraction_of_step"])
    assert [t["enter_calls"] for t in r["timings"]] == [2 * 2] * 4  # one forward mark per guarded step


@pytest.mark.timeout(300)
def test_a_small_same_engine_run_toggles_the_guards_on_one_engine():
    r = guards_inproc.measure(zero=1, steps=2, rounds=2, dim=16, layers=1, batch=4, same_engine=True)
    assert r["same_engine"] and list(r["orders"]) == ["same-engine"] and len(r["round_ratios"]) == 2
    assert [c["off_is_plain"] and c["nan_step_skipped"] for c in r["toggle_check"]] == [True, True]
    assert r["toggle_check"][0]["attributes"] == ["_raytrain_guard", "_take_model_step", "backward", "step"]
    assert r["toggle_check"][0]["hooks"] == ["_forward_pre_hooks"]
    assert r["guard_time"]["nonfinite_guard_ms"] > 0
    assert [t["enter_calls"] for t in r["timings"]] == [2 * 2] * 2  # the forward mark only in on-rounds


class _Engine(torch.nn.Module):
    """The part of a DeepSpeed engine (ZeRO 0) that the guard and the phase marks touch."""

    def __init__(self):
        super().__init__()
        self.module = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.lr_scheduler, self.global_steps, self.skipped_steps = None, 0, 0

    def forward(self, x):
        return self.module(x)

    def backward(self, loss):
        loss.backward()

    def _take_model_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1

    def step(self):
        self._take_model_step()


def _install(only):
    from raytrain.runtime.worker import guard, heartbeat

    def install(engine):
        if only in ("all", "nonfinite"):
            guard.install(engine, rank=0, world_size=1)
        if only in ("all", "marks"):
            heartbeat.instrument(engine)
    return install


def _step(engine, scale=1.0):
    engine.backward(engine(torch.ones(2, 4)).sum() * scale)
    engine.step()


@pytest.mark.parametrize("only", ["all", "nonfinite", "marks", "none"])
def test_same_engine_toggle_takes_the_guards_off_and_puts_them_back(only):
    engine = _Engine()
    toggle = guards_inproc.Toggle(engine, lambda: _install(only)(engine))
    attrs = {"all": ["_raytrain_guard", "_take_model_step", "backward", "step"],
             "nonfinite": ["_raytrain_guard", "_take_model_step", "backward"], "marks": ["backward", "step"],
             "none": []}[only]
    assert toggle.names() == {"attributes": attrs, "hooks": ["_forward_pre_hooks"] if only in ("all", "marks") else []}
    for _ in range(2):  # off and on again: the same state each time
        toggle.off()
        assert toggle.is_plain() and not vars(engine).keys() & {"backward", "_take_model_step", "step"}
        assert not engine._forward_pre_hooks and "_raytrain_guard" not in vars(engine)
        weights, skipped = {k: v.clone() for k, v in engine.module.state_dict().items()}, engine.skipped_steps
        _step(engine, float("nan"))  # plain: nothing skips the step
        assert engine.skipped_steps == skipped and engine.module.weight.isnan().all()
        engine.module.load_state_dict(weights)
        toggle.on()
        assert toggle.is_plain() == (only == "none")
        assert len(engine._forward_pre_hooks) == (1 if only in ("all", "marks") else 0)
        if only in ("all", "nonfinite"):
            skipped = engine.skipped_steps
            _step(engine, float("nan"))
            assert engine.skipped_steps == skipped + 1 and torch.equal(engine.module.weight, weights["weight"])
            _step(engine)
            assert not torch.equal(engine.module.weight, weights["weight"])


def test_same_engine_check_fails_where_the_toggle_leaves_a_guard_behind():
    engine = _Engine()
    toggle = guards_inproc.Toggle(engine, lambda: _install("all")(engine))
    toggle.added.pop("_take_model_step")  # a toggle that forgets one: off keeps the guard's wrapper
    toggle.off()
    assert "_take_model_step" in vars(engine)
    with pytest.raises(AssertionError, match="not the plain one"):
        guards_inproc.toggle_check(toggle, torch.ones(2, 4), torch.ones(2, 1), nonfinite=True)


def test_same_engine_without_the_same_processes_ab_is_refused_naming_what_it_needs(capsys):
    import overhead

    with pytest.raises(SystemExit) as exit_info:
        overhead.parse_args(["--guards-ab", "--same-engine"])
    assert exit_info.value.code == 2 and "--same-engine needs --guards-ab --same-processes" in capsys.readouterr().err
    args = overhead.parse_args(["--guards-ab", "--same-processes", "--same-engine"])
    assert args.same_engine and args.rounds == 80  # one run instead of two build orders: as many pairs in all
