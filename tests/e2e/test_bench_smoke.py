"""The overhead benchmark keeps working: bench/overhead.py --smoke on the suite's cluster (gpu_mfu's CPU
path needs no Ray: tests/bench/test_gpu_mfu_smoke.py).

Benchmarks are not tests of speed: this checks that both sides run, that the JSON has its fields and that
the figures are sane (steps parsed, ratios > 0, the two sides computed the same losses), not that they
meet the goals.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SMOKE_STEPS = 6  # bench/overhead.py's SMOKE_JOB_ARGS


def run_bench(args, env, timeout):
    proc = subprocess.run([sys.executable, *map(str, args)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_overhead_smoke_on_the_suite_cluster(cli, tmp_path):
    out = tmp_path / "overhead.json"
    # cli.env: the suite's RAYTRAIN_HOME, temp dir and ports, so the benchmark uses the running e2e cluster
    proc = run_bench([ROOT / "bench" / "overhead.py", "--smoke", "--out", out], cli.env, timeout=420)
    assert "| zero1 |" in proc.stdout and "A/B" in proc.stdout, proc.stdout
    assert "already running" in proc.stderr  # it found the suite's cluster and so leaves it up
    data = json.loads(out.read_text())
    assert data["settings"]["smoke"] is True and data["settings"]["cluster_started_here"] is False
    assert list(data["configs"]) == ["zero1"]
    cfg = data["configs"]["zero1"]
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 1 and cfg["deepspeed"]["bf16"]["enabled"] is True
    assert cfg["deepspeed"]["gradient_accumulation_steps"] == 4
    sides = {r["side"]: r for r in cfg["runs"]}
    assert set(sides) == {"raytrain", "torchrun"} and len(cfg["runs"]) == 2
    for side, run in sides.items():
        assert run["ok"], (side, run["error"])
        assert run["steps"] == SMOKE_STEPS and len(run["losses"]) == SMOKE_STEPS, run
        assert 0 < run["ctx_ready_s"] < run["first_step_s"] <= run["last_step_s"] < run["wall_s"], run
        assert 0 < run["steady_step_s"] < 60, run
        assert set(run["rss_peak_gb"]) == {"0", "1"} and all(0.05 < v < 20 for v in run["rss_peak_gb"].values()), run
    assert sides["raytrain"]["job_id"] and sides["raytrain"]["job_start_s"] > 0
    # raytrain's CPU workers run with Ray's jemalloc (the local cluster preloads it); torchrun as users run it
    assert (sides["raytrain"]["allocator"], sides["torchrun"]["allocator"]) == ("jemalloc", "default"), sides
    assert cfg["summary"]["allocator"] == {"raytrain": "jemalloc", "torchrun": "default"}
    s = cfg["summary"]
    for key in ("steady_step_s", "first_step_s", "wall_s"):
        assert s[key]["ratio"] > 0, (key, s[key])
    # the same job, seed and DeepSpeed config on both sides: the same losses
    assert s["loss_max_abs_diff"] is not None and s["loss_max_abs_diff"] < 1e-3, s
    assert set(s["goals"]) >= {"steady_ok", "first_step_ok"}


def test_bare_side_with_a_ray_driver_in_each_process(cli):
    """overhead.py --bare-ray --bare-jemalloc's B side: each torchrun process joins the suite's cluster as a Ray
    driver, then trains as before (the run that isolates what a Ray core worker in the process costs)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import benchlib as bl

    flags = bl.submit_flags(workers=2, zero=1, precision="bf16", grad_accum=4, micro_batch=1)
    plan = bl.dry_run_plan(str(ROOT / "jobs" / "gpt_zero.py"), flags, ["--steps", str(SMOKE_STEPS)], cli.env)["plan"]
    extra = {**bl.jemalloc_preload(), **bl.ray_driver_env(cli.env)}
    assert extra["RAYTRAIN_BARE_RAY"] == f"127.0.0.1:{cli.env['RAYTRAIN_PORT']}"
    assert Path(extra["RAY_AUTH_TOKEN_PATH"]).is_file()
    run = bl.run_bare(plan, cli.env, label="zero1", rnd=0, warmup=2, extra_env=extra, timeout=300)
    assert run.ok, run.error
    assert run.allocator == "jemalloc + Ray driver" and run.extra["ray_drivers"] == 2, run.to_dict()
    assert run.steps == SMOKE_STEPS and 0 < run.steady_step_s < 60, run.to_dict()
