"""tests/gpu/run_gpu_suite.py --dry-run on CPU, on the e2e session's cluster: every step of the GPU suite
(cluster, `raytrain gpus`, the example GPT through `raytrain submit` with a checkpoint and a resume, per-worker
memory in `jobs status`, the planner's estimate, bench/gpu_mfu.py bare and through `raytrain submit`) but
CUDA's, so the script a GPU machine runs is known to work before it gets one."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_the_gpu_suite_dry_run_passes_on_cpu(cli, tmp_path):
    out = tmp_path / "dry.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "run_gpu_suite.py"), "--dry-run",
                           "--use-running-cluster", "--out", str(out)],
                          env=cli.env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.exists(), proc.stdout[-5000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    assert proc.returncode == 0 and summary["ok"] and summary["dry_run"], json.dumps(summary, indent=1)[-6000:]
    assert list(checks) == ["cuda", "cluster", "gpus", "gpt_bf16", "memory", "planner", "resume", "gpt_fp16", "mfu",
                            "flight_recorder"]
    assert checks["flight_recorder"]["env"] == {  # CPU workers: no NCCL flight recorder
        "TORCH_NCCL_TRACE_BUFFER_SIZE": None, "TORCH_NCCL_DUMP_ON_TIMEOUT": None, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": None}
    assert checks["cuda"]["skipped"] and checks["gpt_fp16"]["skipped"]  # the only steps a CPU cannot do
    assert checks["gpt_bf16"]["checkpoints"] == [5, 10] and checks["resume"]["steps"] == [11, 12, 13, 14]
    assert checks["mfu"]["raytrain_tokens_per_s"] > 0 and checks["mfu"]["bare_tokens_per_s"] > 0
