"""`raytrain cluster status` shows on which node a running job's Ray Train workers are, and stops showing
them once the job is stopped (real local Ray cluster, Ray's state API through the dashboard)."""
import json
import time

import pytest

from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def workers_of(status: dict, job: str) -> list[dict]:
    return [dict(w, node_id=n["node_id"]) for n in status["nodes"] for w in (n["workers"] or []) if w["job"] == job]


def test_status_lists_a_running_jobs_workers_per_node(cli):
    proc = cli("submit", JOBS / "cnn.py", "--workers", "2", "--name", "placed", "--no-wait", "--json",
               "--", "--steps", "100000", "--step-sleep", "0.2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)["id"]
    try:
        deadline = time.monotonic() + 180
        while True:
            status = cli.json("cluster", "status")
            assert status["workers_error"] is None, status["workers_error"]
            placed = workers_of(status, job)
            if sum(w["count"] for w in placed) == 2 or time.monotonic() > deadline:
                break
            time.sleep(2)
        # the local cluster is one node: both workers are there, as two processes of the job 'placed'
        (node,) = status["nodes"]
        assert placed == [{"job": job, "name": "placed", "ray_job_id": placed[0]["ray_job_id"], "count": 2,
                           "pids": placed[0]["pids"], "node_id": node["node_id"]}], status
        assert len(set(placed[0]["pids"])) == 2 and placed[0]["ray_job_id"]

        text = cli("cluster", "status", check=True).stdout
        assert f"{job} x2" in text and "Train_workers" in text  # (piped: headings without spaces)
        # Stop once training runs, not while Ray Train is still starting the worker group: a stop in that
        # window can leave the job's placement group behind in Ray 2.60 (seen once in CI), and the next
        # job then waits for CPUs forever.
        deadline = time.monotonic() + 120
        while not cli.facts(job).metrics and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        assert f"{job}: stopped" in cli("jobs", "stop", job, check=True).stdout
    # the driver's last word says so, in the job's log and in the run's record (read once the cluster is gone)
    stopped = cli.facts(job).stopped
    assert {k: stopped.get(k) for k in ("event", "signal")} == {"event": "stopped", "signal": "SIGTERM"}, stopped
    # where the workers committed the step in progress before Ray's SIGKILL, the second word names it
    assert set(stopped) <= {"event", "signal", "checkpoint_step", "message"}, stopped
    if "checkpoint_step" in stopped:
        assert f"the checkpoint of step {stopped['checkpoint_step']} is committed" in stopped["message"], stopped

    deadline = time.monotonic() + 60
    while workers_of(status := cli.json("cluster", "status"), job) and time.monotonic() < deadline:
        time.sleep(1)
    assert workers_of(status, job) == [] and status["nodes"][0]["workers"] == [], status


def _dashboard_status(cli, path: str) -> int:
    """The HTTP status of ``GET path`` on the e2e cluster's dashboard, with the cluster's token."""
    import requests

    from pathlib import Path

    token = (Path(cli.env["RAYTRAIN_HOME"]) / "auth_token").read_text().strip()
    url = f"http://127.0.0.1:{cli.env['RAYTRAIN_DASHBOARD_PORT']}{path}"
    return requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code


def _head_processes(cli) -> dict[int, str]:
    """pid -> command line of every process in the local head's session (its ``ray start`` is the leader)."""
    import os

    from pathlib import Path

    head = json.loads((Path(cli.env["RAYTRAIN_HOME"]) / "cluster.json").read_text())["pid"]
    found = {}
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.getsid(int(name)) == head:
                found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
        except OSError:
            continue
    return found


def test_the_local_dashboard_serves_what_raytrain_uses_and_not_the_modules_it_leaves_out(cli):
    """The local head's dashboard loads only the modules raytrain and the dashboard's pages use
    (raytrain.ray_tuning.ray_start): jobs, the state API, nodes; not Serve's, Ray Data's or Ray Train's (whose runs
    page needs a state-tracking actor raytrain does not start: with it loaded, it answers HTTP 500)."""

    def status(path):
        return _dashboard_status(cli, path)

    assert status("/api/version") == 200 and status("/api/jobs/") == 200
    assert status("/api/v0/actors?limit=10") == 200 and status("/nodes?view=summary") == 200
    assert status("/api/serve/applications/") == 404 and status("/api/data/datasets/01000000") == 404
    assert status("/api/train/v2/runs") == 404

    # the dashboard and its module processes (forked from a forkserver that imports raytrain's module first) run
    # through raytrain's module, which polls less often (raytrain.ray_tuning.ray_dashboard); the module answers
    # above show the dashboard works that way. Ray's log monitor runs as Ray starts it.
    commands = list(_head_processes(cli).values())
    assert any("-m raytrain.ray_tuning.ray_dashboard " in c for c in commands), commands
    assert any("/ray/_private/log_monitor.py " in c for c in commands), commands
    assert any("multiprocessing.forkserver" in c and "raytrain.ray_tuning.ray_dashboard" in c for c in commands), commands
    # the raylet starts its workers through raytrain's setup step (no second Ray import per worker process),
    # up to four at once (raytrain.ray_tuning.ray_setup_worker, ray_start); the jobs the suite runs use it
    raylet = next(c for c in commands if "/raylet/raylet " in c)
    assert "ray_tuning/ray_setup_worker.py " in raylet and "--maximum_startup_concurrency=4 " in raylet, raylet
    assert "--num_prestart_python_workers=0 " in raylet, raylet


def test_a_dashboard_module_that_dies_is_restarted_by_the_slower_health_check(cli):
    """raytrain.ray_tuning.ray_dashboard health-checks the dashboard's modules every 10 s, not every second: a
    module process that dies is still found and restarted (forked again from the forkserver), and its API
    answers again."""
    import os
    import signal

    def state_module() -> int | None:
        return next((pid for pid, c in _head_processes(cli).items() if c.startswith("ray-dashboard-StateHead")), None)

    def actors_status() -> int:
        return _dashboard_status(cli, "/api/v0/actors?limit=5")

    assert actors_status() == 200
    old = state_module()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60  # the next health check (10 s), then the module's start
    while time.monotonic() < deadline:
        new = state_module()
        if new not in (None, old) and actors_status() == 200:
            break
        time.sleep(1)
    else:
        raise AssertionError("the killed StateHead module was not restarted within 60 s")
