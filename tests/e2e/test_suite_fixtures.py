"""The e2e suite's own guards: the cluster that answers on the session's ports is the session's own, and no
job outlives the test that started it."""
import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import own_cluster, stop_unfinished_jobs, unfinished_jobs

pytestmark = pytest.mark.e2e


def test_a_foreign_listener_on_the_sessions_port_is_not_trusted(tmp_path):
    """No record in the session's RAYTRAIN_HOME, but something answers on its port: an error, not "running"."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env = {"RAYTRAIN_HOME": str(tmp_path), "RAYTRAIN_PORT": str(port), "RAYTRAIN_DASHBOARD_PORT": str(free_port())}
        with pytest.raises(AssertionError, match="not the suite's cluster"):
            own_cluster(env)
    assert own_cluster(env) is None  # nothing answers: no cluster, start one


def test_a_record_for_another_ray_session_is_refused(cli, tmp_path):
    """The session's ports answer with the session's token, but the record names another Ray session (a
    cluster restarted by someone else under the same record): refused."""
    record = own_cluster(cli.env)
    assert record is not None
    other_home, other_temp = tmp_path / "home", tmp_path / "temp"
    other_home.mkdir()
    (other_temp / "session_2001-01-01_00-00-00_000000_1").mkdir(parents=True)
    os.symlink("session_2001-01-01_00-00-00_000000_1", other_temp / "session_latest")
    shutil.copy(Path(cli.env["RAYTRAIN_HOME"]) / "cluster.json", other_home / "cluster.json")
    forged = json.loads((other_home / "cluster.json").read_text())
    forged["temp_dir"] = str(other_temp)
    (other_home / "cluster.json").write_text(json.dumps(forged))
    with pytest.raises(AssertionError, match="runs Ray session"):
        own_cluster({**cli.env, "RAYTRAIN_HOME": str(other_home)})


def test_an_unfinished_job_is_stopped_after_its_test(cli, request):
    assert "_no_job_outlives_its_test" in request.fixturenames  # autouse for every e2e test
    proc = cli("submit", Path(__file__).parent / "jobs" / "sleepy.py", "--workers", "1", "--no-wait", "--json", "--", "500")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)["id"]
    assert job in unfinished_jobs(cli.env)
    assert job in stop_unfinished_jobs(cli)
    assert cli.json("jobs", "status", job)["state"] == "stopped"
    assert unfinished_jobs(cli.env) == []


def test_ci_stops_a_recorded_cluster_by_its_record(tmp_path):
    """`.ci/run --stop-recorded FILE` stops a cluster the suite recorded (its own RAYTRAIN_HOME's record names
    the head process), the way CI cleans up after a killed run, without any process-name pattern."""
    import subprocess
    import sys
    import tempfile

    from raytrain.clusters import ray_process
    from tests.conftest import ROOT, record_cluster
    from tests.e2e.conftest import CLI

    home = Path(tempfile.mkdtemp(prefix="raytrain-ci-stop-"))
    temp = Path(tempfile.mkdtemp(prefix="rt-ci-", dir="/tmp"))
    port, dport = free_port(), free_port()
    env = {**os.environ, "RAYTRAIN_HOME": str(home), "RAYTRAIN_RAY_TEMP_DIR": str(temp),
           "RAYTRAIN_PORT": str(port), "RAYTRAIN_DASHBOARD_PORT": str(dport), "RAYTRAIN_TEST_RECORDS": str(tmp_path / "r.jsonl")}
    cli = CLI(env)
    try:
        cli("cluster", "up", "--num-cpus", "1", check=True, timeout=180)
        pid = json.loads((home / "cluster.json").read_text())["pid"]
        os.environ["RAYTRAIN_TEST_RECORDS"] = env["RAYTRAIN_TEST_RECORDS"]
        try:
            record_cluster(home, temp, port, dport, "test")
        finally:
            del os.environ["RAYTRAIN_TEST_RECORDS"]
        proc = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--stop-recorded", env["RAYTRAIN_TEST_RECORDS"]],
                              env={**os.environ, "CI_PYTHON": sys.executable}, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert f"stopping the cluster the suite left running under {home}" in proc.stderr
        assert not (home / "cluster.json").exists() and not ray_process.pid_alive(pid)
    finally:
        cli("cluster", "down", "--force", timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)
