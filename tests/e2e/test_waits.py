"""Waits that end (issue 40) on a real local Ray cluster: a tracker whose server never answers is dropped
while training goes on, and the rank logs still reach the run's storage through their copier."""
import json
import re
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def test_a_tracker_whose_server_never_answers_is_dropped_and_training_and_rank_logs_go_on(cli):
    """An MLflow URI whose server accepts connections and never answers: before, rank 0 started the tracker
    on its training thread with MLflow's default retries (minutes) while rank 1 waited in the first
    collective. Now the steps go on, the tracker is dropped within its bound (a tracker event, a line), and
    every checkpoint after that waits for nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)  # never accepted: connections complete, nothing ever answers
    try:
        start = time.monotonic()
        proc = cli("submit", JOBS / "cnn.py", "--workers", "2", "--zero", "1", "--micro-batch", "16",
                   "--checkpoint-every", "4", "--track", "mlflow",
                   "--mlflow-uri", f"http://127.0.0.1:{server.getsockname()[1]}", "--", "--steps", "8",
                   timeout=600)
        took = time.monotonic() - start
    finally:
        server.close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "raytrain: --track mlflow:" in out and "training goes on without it" in out, out
    job = re.search(r"raytrain-[A-Za-z0-9._-]+-\d{8}-\d{6}-[0-9a-f]{6}", out).group(0)
    facts = cli.facts(job)
    assert [m["step"] for m in facts.metrics] == list(range(1, 9))
    assert "mlflow" in facts.trackers_dropped, facts.trackers_dropped
    # the start (60 s) or MLflow's bounded retries (3 requests of 10 s) ended it, not the default minutes
    assert took < 300, took
    info = cli.json("jobs", "status", job)
    assert info["state"] == "succeeded"
    assert any(w.startswith("--track mlflow was dropped") for w in info["warnings"]), info
    record = Path(cli.env["RAYTRAIN_HOME"]) / "runs" / job / "raytrain"
    assert '"event":"tracker"' in (record / "events-rank-0.log").read_text()
    # the rank logs reached the storage through the copier (the final copy after the workers exited)
    deadline = time.monotonic() + 60
    logs = [record / "logs" / f"rank-{r}.log" for r in (0, 1)]
    while not (all(p.is_file() and "# raytrain rank" in p.read_text() for p in logs)
               and "training goes on without it" in logs[0].read_text()):
        assert time.monotonic() < deadline, [p.read_text()[-1000:] if p.is_file() else f"no {p}" for p in logs]
        time.sleep(0.5)
    ranked = cli("jobs", "logs", job, "--rank", "0", check=True).stdout
    assert "--track mlflow" in ranked, ranked[-2000:]
    assert json.dumps(facts.trackers_dropped)
