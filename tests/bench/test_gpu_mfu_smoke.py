"""bench/gpu_mfu.py keeps working on its CPU path (one process, DeepSpeed on CPU, no Ray; 1-3 minutes on 2
cores, so not among the unit tests, and not among the e2e tests, which need the Ray cluster).

Not a test of speed: the JSON has its fields and the figures are sane, not that they meet the goals.
"""
import json
import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_mfu_tiny_cpu_path(tmp_path):
    out = tmp_path / "mfu.json"
    args = [sys.executable, str(ROOT / "bench" / "gpu_mfu.py"), "--device", "cpu", "--tiny", "--fp16-steps", "2", "--profile-steps", "1", "--out", str(out)]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"gpu_mfu.py exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "MFU on CPU is not meaningful" in proc.stdout
    assert "| eager |" in proc.stdout and "n/a (CPU)" in proc.stdout, proc.stdout
    assert "fp16 variant skipped: DeepSpeed refuses fp16 on CPU" in proc.stdout, proc.stdout
    data = json.loads(out.read_text())
    assert data["deepspeed"]["zero_optimization"]["stage"] == 2 and data["deepspeed"]["bf16"]["enabled"] is True
    (r,) = data["results"]
    assert r["tokens_per_s"] > 0 and r["flops_per_token"] > 6 * r["params_for_flops"] > 0
    assert r["mfu"] is None and r["planner"]["allocated"] > 0 and r["peak_memory_bytes"] > 0
    assert r["precision"] == "bf16" and r["loss_scaling"] is None and r["nvml"] is None and data["gpus"] == []
    # The engine is gone after its variant (DeepSpeed's hooks would keep it, and the next variant's peak, alive)
    assert r["engine_released"] is True
    prof = r["profile"]
    assert prof["steps"] == 1 and prof["device_busy_fraction"] is None, prof
    assert prof["ms_per_step_by_kind"].get("matmul", 0) > 0 and abs(sum(prof["share_by_kind"].values()) - 1) < 0.01, prof
    assert "eager profile (1 steps, CPU operators" in proc.stdout, proc.stdout
