"""A rank that stops making progress is found and named (issue 37): the hang watchdog, `jobs stack`, and
--on-hang restart from the last checkpoint."""
import subprocess
import sys
import time

import pytest

from tests.e2e.test_submit import job_id_of

pytestmark = pytest.mark.e2e

JOB = __import__("pathlib").Path(__file__).parent / "jobs" / "hang.py"
HANG_TIMEOUT = 20
SLEEP_LINE = "hang.py:15"  # stuck_loader's time.sleep in tests/e2e/jobs/hang.py
FLAGS = ["--workers", "2", "--zero", "0", "--micro-batch", "4", "--hang-timeout", str(HANG_TIMEOUT)]


def wait_for(path, needle, timeout, proc):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if needle in text:
            return text
        assert proc.poll() is None, f"submit ended before {needle!r} was printed:\n{text}"
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} not seen within {timeout} s:\n{path.read_text()}")


def test_hang_is_named_in_the_terminal_status_and_stack(e2e_env, tmp_path):
    out = tmp_path / "submit.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "raytrain.cli.main", "submit", str(JOB), *FLAGS],
                                env=e2e_env.env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    job = None
    try:
        text = wait_for(out, "step 5", 300, proc)  # the fifth step is out: the hang starts now
        job = job_id_of(text)
        t0 = time.monotonic()
        text = wait_for(out, "raytrain:   rank 1", HANG_TIMEOUT + 30 + 15, proc)  # + the poll and the stack requests
        assert time.monotonic() - t0 <= HANG_TIMEOUT + 30, text
        hang_lines = [line for line in text.splitlines() if "raytrain:   rank" in line]
        rank0 = next(line for line in hang_lines if "rank 0" in line)
        rank1 = next(line for line in hang_lines if "rank 1" in line)
        assert "waiting in a collective" in rank0, text
        assert "not in a collective" in rank1 and "stuck_loader" in rank1 and SLEEP_LINE in rank1, text

        status = e2e_env("jobs", "status", job, check=True).stdout
        assert "stuck_loader" in status and SLEEP_LINE in status and "waiting in a collective" in status, status

        stack = e2e_env("jobs", "stack", job, timeout=120, check=True).stdout
        assert "rank 0 (pid" in stack and "rank 1 (pid" in stack, stack
        assert f"stuck_loader ({JOB}:15)" in stack or SLEEP_LINE in stack, stack
        data = e2e_env.json("jobs", "stack", job, timeout=120)
        assert sorted(r["rank"] for r in data["ranks"]) == [0, 1], data
        assert all(r["threads"][0]["training"] for r in data["ranks"]), data
    finally:
        if job:
            e2e_env("jobs", "stop", job, timeout=120)
        proc.kill()
        proc.wait(timeout=30)


def test_on_hang_restart_finishes_as_a_clean_run(e2e_env):
    restarted = e2e_env("submit", JOB, *FLAGS, "--on-hang", "restart", "--max-failures", "1",
                        "--checkpoint-every", "2", timeout=600)
    out = restarted.stdout + restarted.stderr
    assert restarted.returncode == 0, out
    assert "restarting the workers" in out and "rank 1" in out, out
    clean = e2e_env("submit", JOB, *FLAGS, "--", "--hang-at", "-1", timeout=600)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    params = [e2e_env.facts(job_id_of(p.stdout + p.stderr)).last_metrics["params"] for p in (restarted, clean)]
    assert params[0] == params[1], params


def test_on_hang_fail_ends_the_job_with_the_summary_as_its_reason(e2e_env):
    proc = e2e_env("submit", JOB, *FLAGS, "--on-hang", "fail", timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    job = job_id_of(out)
    error = e2e_env.facts(job).error
    assert error["type"] == "Hang" and "stuck_loader" in error["message"] and SLEEP_LINE in error["message"], error
    status = e2e_env.json("jobs", "status", job)
    assert status["state"] == "failed", status
