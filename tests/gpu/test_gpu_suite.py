"""raytrain on a real GPU: tests/gpu/run_gpu_suite.py (see its docstring and docs/testing.md), skipped without
CUDA. Its --dry-run mode runs on CPU in tests/e2e/test_gpu_suite_dry_run.py."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, needs


def _cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def test_raytrain_on_one_gpu(tmp_path):
    reason = _cuda()
    if reason:
        pytest.skip(needs("a CUDA GPU", reason))
    out = tmp_path / "gpu-suite.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "run_gpu_suite.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    summary = json.loads(out.read_text()) if out.exists() else None
    assert proc.returncode == 0 and summary and summary["ok"], proc.stdout[-5000:] + proc.stderr[-3000:]
    assert {c["name"] for c in summary["checks"]} >= {"cuda", "gpus", "gpt_bf16", "gpt_fp16", "memory", "planner",
                                                        "resume", "mfu"}
