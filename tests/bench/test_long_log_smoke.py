"""bench/long_log.py on a small run: the log and record it writes read back to every step, and each figure is
there (the bench's own asserts check the facts' last step)."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def test_long_log_smoke(tmp_path):
    out = tmp_path / "long_log.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "long_log.py"), "--steps", "3000", "--rounds", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["steps"] == 3000 and result["log_bytes"] > 3000 * 200
    assert all(len(v) == 1 and v[0] > 0 for v in result["seconds"].values()), result["seconds"]
    assert result["ended_over_record"] < 0.5, result  # an ended job whose log is whole: its record not read
    assert "| JobFacts.from_lines of the log |" in proc.stdout
