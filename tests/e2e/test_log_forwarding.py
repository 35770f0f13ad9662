"""The job's log keeps every event when Ray's forwarding of the workers' lines stalls at the end of a run (a
node's log monitor starved on a loaded machine: tests/multinode/test_drain.py under load lost the last
checkpoint's event): the driver copies what never came from the run's record (runtime.driver.log_drain)."""
import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def _log_monitor(env) -> int:
    """The PID of the suite cluster's log monitor (the one of its own Ray session dir)."""
    session = f"--session-dir={env['RAYTRAIN_RAY_TEMP_DIR']}/"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(part.endswith("log_monitor.py") for part in cmd) and any(part.startswith(session) for part in cmd):
            found.append(int(pid))
    assert len(found) == 1, found
    return found[0]


def test_events_that_never_reached_the_log_are_copied_from_the_runs_record(cli):
    monitor = _log_monitor(cli.env)
    os.kill(monitor, signal.SIGSTOP)  # from here on no worker line reaches the driver
    try:
        proc = cli("submit", JOBS / "cnn.py", "--workers", "2", "--checkpoint-every", "2", "--json", "--",
                   "--steps", "4", timeout=300)
    finally:
        os.kill(monitor, signal.SIGCONT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)["id"]
    facts = cli.facts(job)
    assert [m["step"] for m in facts.metrics] == [1, 2, 3, 4] and facts.checkpoints == [2, 4], facts
    assert facts.engine and facts.finished, facts
    log = cli("jobs", "logs", job, "-v", check=True).stdout
    assert "(rank 0, from the run's record) @@raytrain" in log, log[-3000:]
    warning = next(line for line in log.splitlines() if "did not reach the job's log" in line)
    assert "(no line came for 10 s)" in warning and "copied here from the run's record" in warning, warning
