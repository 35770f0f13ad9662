"""A rank consistently slower than the others is named a straggler, with its node, in the terminal, `jobs
status` and the job's events; the alarm clears when it recovers; a clean run gives no alarm (issue 37)."""
import json
import subprocess
import sys

import pytest

from raytrain import events, straggler
from tests.e2e.test_hang import wait_for
from tests.e2e.test_submit import job_id_of

pytestmark = [pytest.mark.e2e, pytest.mark.alone]  # a rank's speed against the other's

JOB = __import__("pathlib").Path(__file__).parent / "jobs" / "straggler.py"
FLAGS = ["--workers", "2", "--zero", "0", "--micro-batch", "4"]
SLOW_FROM, SLOW_UNTIL = 30, 130  # after the detector's 20 warm-up steps




def compute_dumps(log: str) -> dict[int, list]:
    out = {}
    for line in log.splitlines():
        if "@@compute " in line:
            data = json.loads(line.split("@@compute ", 1)[1])
            out[data["rank"]] = data["compute"]
    return out


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def test_a_rank_slowed_2x_is_named_within_20_steps_and_the_alarm_clears(e2e_env, tmp_path):
    out = tmp_path / "submit.out"
    job_args = ["--steps", "210", "--work-ms", "60", "--slow-rank", "1", "--slow-from", str(SLOW_FROM),
                "--slow-until", str(SLOW_UNTIL), "--dump-compute"]
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "raytrain.cli.main", "submit", str(JOB), *FLAGS, "--",
                                 *job_args], env=e2e_env.env, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    job = None
    try:
        text = wait_for(out, "is a straggler", 300, proc)
        job = job_id_of(text)
        status = e2e_env("jobs", "status", job, check=True).stdout
        assert "straggler: rank 1 (" in status and "is a straggler" in status, status
        proc.wait(timeout=300)
        text = out.read_text()
        assert proc.returncode == 0, text
    finally:
        if proc.poll() is None:
            if job:
                e2e_env("jobs", "stop", job, timeout=120)
            proc.kill()
            proc.wait(timeout=30)
    named = next(line for line in text.splitlines() if "is a straggler" in line)
    assert "rank 1 (" in named, named  # with its node
    assert "recovered" in text, text

    log = e2e_env("jobs", "logs", job, "-v", check=True).stdout
    seen = [e for e in map(events.parse_line, log.splitlines()) if e and e.get("event") == events.STRAGGLER]
    seen = list({json.dumps(e, sort_keys=True): e for e in seen}.values())  # a line may reach the log twice
    assert [(e["rank"], e["state"]) for e in seen] == [(1, "slow"), (1, "recovered")], seen  # one episode
    assert seen[0]["node"], seen
    # The data named it within 20 steps of the slow-down (the event itself follows at the next beat and poll).
    assert seen[0]["since_step"] <= SLOW_FROM + 20, seen
    assert SLOW_UNTIL < seen[1]["step"], seen
    # Compute excludes the time waiting in collectives: the fast rank waited for the slow one, and its compute
    # stays near its own work (60 ms), not the slowed step (about 120 ms).
    dumps = compute_dumps(log)
    fast = median([s for step, s in dumps[0] if SLOW_FROM + 5 < step <= SLOW_UNTIL])
    slow = median([s for step, s in dumps[1] if SLOW_FROM + 5 < step <= SLOW_UNTIL])
    assert slow > 1.6 * fast, (fast, slow)
    assert e2e_env.facts(job).stragglers == {}, "the alarm cleared"


def test_500_clean_steps_give_no_straggler_alarm(e2e_env, tmp_path):
    proc = e2e_env("submit", JOB, *FLAGS, "--", "--steps", "500", "--work-ms", "30", "--dump-compute", timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "is a straggler" not in text, text
    job = job_id_of(text)
    log = e2e_env("jobs", "logs", job, "-v", check=True).stdout
    assert '"event":"straggler"' not in log
    dumps = compute_dumps(log)
    (tmp_path / "compute.json").write_text(json.dumps(dumps))  # tests/unit/data/straggler_clean_500.json's source
    assert sorted(dumps) == [0, 1] and all(len(v) >= 490 for v in dumps.values()), {r: len(v) for r, v in dumps.items()}
    detector = straggler.Detector()  # the same rule, replayed over every step's recorded timings
    for step in range(1, 501):
        beats = [{"rank": r, "compute": [c for c in v if c[0] <= step]} for r, v in dumps.items()]
        assert detector.update(beats) == [], step
