"""bench/data.py --scale keeps working: a small generated Parquet dataset, one epoch on the suite's cluster,
the JSON has its fields and the figures are sane (each worker read its share, not the whole dataset; every
row once). Not a test of speed or of the object-store ratio (the suite's cluster has its own object store)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_data_scale_smoke_on_the_suite_cluster(cli, tmp_path):
    out = tmp_path / "scale.json"
    args = [ROOT / "bench" / "data.py", "--scale", "--scale-gb", "0.064", "--scale-files", "64", "--dim", "256",
            "--hidden", "32", "--micro-batch", "512", "--warmup", "2", "--scale-dir", tmp_path / "d", "--out", out]
    proc = subprocess.run([sys.executable, *map(str, args)], env=cli.env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    s = json.loads(out.read_text())["summary"]
    assert s["ok"] and s["dataset_rows"] > 0 and s["dataset_bytes"] > 60e6, s
    assert len(s["bytes_read_per_worker"]) == 2 and len(s["rows_per_worker"]) == 2, s
    assert sum(s["rows_per_worker"]) > s["dataset_rows"] - 2 * 512 and max(s["rows_per_worker"]) <= -(-s["dataset_rows"] // 2)
    # each worker fetched about its half of the blocks (64 of 1 MiB), not all of them: pieces of 8 blocks not
    # aligned to the blocks share their edge blocks, about 9/16 at 2 ranks
    assert s["blocks"] >= 48 and 0 < s["read_share"] <= 0.65, s
    assert s["object_store_bytes"] > 0 and s["data_wait_share"] is not None and s["steps"] > 2, s
    assert set(s["goals"]) == {"read_share_ok", "data_wait_ok", "rss_ok", "dataset_at_least_4x_object_store"}
