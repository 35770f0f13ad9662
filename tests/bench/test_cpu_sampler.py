"""bench/benchlib.CpuSampler splits a run's steady window into the training processes' CPU and the rest."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import benchlib  # noqa: E402


def test_the_window_is_read_from_samples_inside_it_so_workers_that_exit_right_after_are_counted():
    cpu = benchlib.CpuSampler(interval=0.5)
    hz = cpu._hz
    worker, other = 101, 202
    # (time, {pid: (CPU ticks, is a training process)}): the worker runs 1.8 cores, the rest 0.1; the worker
    # exits right after the last steady step (t=12), before the next sample
    cpu.samples = [(t, {worker: (int(1.8 * hz * (t - 9)), True), other: (int(0.1 * hz * t), False)})
                   for t in (9.0, 9.5, 10.0, 10.5, 11.0, 11.5)]
    cpu.samples.append((12.3, {other: (int(0.1 * hz * 12.3), False)}))
    usage = cpu.usage(9.2, 12.0)
    assert usage["window_s"] == 2.0
    assert abs(usage["workers"] - 1.8) < 0.05 and abs(usage["other"] - 0.1) < 0.05
    assert cpu.usage(9.2, 10.2) is None  # fewer than three samples inside: too short to say
