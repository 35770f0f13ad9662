"""A job's secret argument on a real local cluster: the job gets it; the run's record, its rank logs, the
tracker's files and the job's log do not hold it; the record is private (folders 0700, files 0600)."""
import hashlib
import json
import os
import secrets
import stat
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_a_secret_job_argument_reaches_the_job_and_nothing_else(cli, tmp_path):
    token = "hf_" + secrets.token_hex(16)
    (tmp_path / "job.py").write_text(
        "import hashlib\n"
        "def train(ctx):\n"
        "    got = hashlib.sha256(ctx.args[1].encode()).hexdigest()\n"
        f"    ctx.report({{'step': 1, 'loss': 1.0 if got == {hashlib.sha256(token.encode()).hexdigest()!r} else 0.0}})\n"
    )
    proc = cli("submit", tmp_path / "job.py", "--workers", "1", "--track", "tensorboard", "--track-args", "--json",
               "--", "--hub_token", token)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert token not in proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["last_metrics"]["loss"] == 1.0  # the workers got the real value back from $RAYTRAIN_PLAN
    run = Path(cli.env["RAYTRAIN_HOME"]) / "runs" / out["id"]
    record = run / "raytrain"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name.startswith("events.out.tfevents") for p in files), files
    for path in files:
        assert token.encode() not in path.read_bytes(), path
    assert token not in cli("jobs", "logs", out["id"], "-v").stdout
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(record) == 0o700 and mode(record / "logs") == 0o700 and mode(run / "tensorboard") == 0o700
    assert all(mode(p) == 0o600 for p in [*record.glob("events-*.log"), *(record / "logs").glob("rank-*.log"),
                                         record / "trackers.json"])
