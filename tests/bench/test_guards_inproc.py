"""bench/guards_inproc.py (overhead.py --guards-ab --same-processes): the median's confidence interval, and a
small real run (two gloo processes, real engines) whose figures are all there: the pairs of both build
orders, the guards' own timed seconds, the phase marks seen once per step."""
import sys
from pathlib import Path

import pytest

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
