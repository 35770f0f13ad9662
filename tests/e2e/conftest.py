"""End-to-end fixtures: one real local Ray cluster for the whole session, driven through the real CLI.

The cluster uses its own RAYTRAIN_HOME, temp dir and ports (picked free at the start of each run unless
RAYTRAIN_TEST_PORT / RAYTRAIN_TEST_DASHBOARD_PORT pin them), so it never touches a developer's cluster,
and is stopped at the end of the session whatever happened. Before each test the cluster that answers is
checked to be the suite's own (:func:`own_cluster`); after each test every unfinished job is stopped
(:func:`_no_job_outlives_its_test`). The suite's clusters are listed in $RAYTRAIN_TEST_RECORDS
(``tests.conftest.record_cluster``) for .ci/run to stop what a killed run left.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raytrain.events import JobFacts
from tests.conftest import free_port, record_cluster


class CLI:
    def __init__(self, env):
        self.env = env

    def __call__(self, *args, timeout=300, check=False):
        proc = subprocess.run(
            [sys.executable, "-m", "raytrain.cli.main", *map(str, args)],
            env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"raytrain {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args, **kw):
        return json.loads(self(*args, "--json", check=True, **kw).stdout)

    def facts(self, job_id) -> JobFacts:
        return JobFacts.from_lines(self("jobs", "logs", job_id, "-v", check=True).stdout.splitlines())


@pytest.fixture(scope="session")
def e2e_env(request):
    workers = getattr(request.config, "workerinput", {}).get("workercount", 1)
    if workers > 1 and (os.environ.get("RAYTRAIN_TEST_PORT") or os.environ.get("RAYTRAIN_TEST_DASHBOARD_PORT")):
        pytest.fail(f"RAYTRAIN_TEST_PORT / RAYTRAIN_TEST_DASHBOARD_PORT pin one cluster's ports, and with -n {workers} "
                    f"each worker starts its own cluster: run with -n 0, or unset them (free ports are picked)")
    home = Path(tempfile.mkdtemp(prefix="raytrain-e2e-"))
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths
    port = os.environ.get("RAYTRAIN_TEST_PORT") or str(free_port())
    dashboard_port = os.environ.get("RAYTRAIN_TEST_DASHBOARD_PORT") or str(free_port(avoid={int(port)}))
    record_cluster(home, temp_dir, port, dashboard_port, "e2e")
    env = {
        **os.environ,
        "RAYTRAIN_HOME": str(home),
        "RAYTRAIN_RAY_TEMP_DIR": str(temp_dir),
        "RAYTRAIN_PORT": port,
        "RAYTRAIN_DASHBOARD_PORT": dashboard_port,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }
    env.pop("RAYTRAIN_ADDRESS", None)
    env.pop("RAY_ADDRESS", None)
    cli = CLI(env)
    _SESSION.append(cli)
    try:
        yield cli
    finally:
        _SESSION.remove(cli)
        cli("cluster", "down", "--force", timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


_SESSION: list[CLI] = []  # the session's CLI while e2e_env is set up
HERE = Path(__file__).parent


def _answers(port: str) -> bool:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def own_cluster(env: dict) -> dict | None:
    """The session's own cluster, if it runs: the head record in the session's RAYTRAIN_HOME names a live
    process (same start time) on the session's ports, and the dashboard on that port accepts the session's
    token and runs the Ray session of the record's temp dir. None if no cluster runs; AssertionError if
    something else answers on the session's ports (a port is never trusted for who answers on it)."""
    from raytrain.clusters import ray_process
    from raytrain.clusters.dashboard import Dashboard, token_headers

    record_file = Path(env["RAYTRAIN_HOME"]) / ray_process.RECORDS["head"]
    port, dashboard_port = env["RAYTRAIN_PORT"], env["RAYTRAIN_DASHBOARD_PORT"]
    record = json.loads(record_file.read_text()) if record_file.is_file() else None
    if record is None or not ray_process.same_process(record["pid"], record.get("pid_started")):
        assert not (_answers(port) or _answers(dashboard_port)), (
            f"something that is not the suite's cluster answers on port {port} or {dashboard_port}")
        return None
    assert record["gcs_address"].endswith(f":{port}") and record["dashboard_url"].endswith(f":{dashboard_port}"), record
    token = Path(record["token_path"]).read_text().strip()
    version = Dashboard(record["dashboard_url"], token_headers(token)).check_reachable()
    session = Path(record["temp_dir"], "session_latest").resolve().name
    assert version.get("session_name") == session, (
        f"the dashboard on {dashboard_port} runs Ray session {version.get('session_name')}, not the suite's {session}")
    return record


@pytest.fixture
def cli(e2e_env):
    """The CLI with the session's local cluster running (started if an earlier test did not, or stopped it):
    the cluster that answers is checked to be the session's own (:func:`own_cluster`), in-process rather than
    by a `cluster status` run (a CLI process per test)."""
    if own_cluster(e2e_env.env) is None:
        e2e_env("cluster", "up", "--num-cpus", "2", check=True, timeout=180)
        assert own_cluster(e2e_env.env) is not None
    return e2e_env


UNFINISHED = ("PENDING", "RUNNING")


def unfinished_jobs(env: dict) -> list[str]:
    """Ray job ids (submission ids) of the session cluster's jobs that have not ended; [] with no cluster."""
    from raytrain.clusters import ray_process
    from raytrain.clusters.dashboard import Dashboard, token_headers

    record_file = Path(env["RAYTRAIN_HOME"]) / ray_process.RECORDS["head"]
    if not record_file.is_file():
        return []
    record = json.loads(record_file.read_text())
    if not ray_process.same_process(record["pid"], record.get("pid_started")):
        return []
    dashboard = Dashboard(record["dashboard_url"], token_headers(Path(record["token_path"]).read_text().strip()))
    jobs = dashboard.get("/api/jobs/", timeout=15)
    return [j["submission_id"] for j in jobs if j.get("submission_id") and j.get("status") in UNFINISHED]


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test(request):
    """After each e2e test, stop every job it left unfinished (a failed assertion before its own `jobs stop`
    must not leave a long job holding the cluster's CPUs for the tests after it)."""
    yield
    if _is_e2e(request.node) and _SESSION:
        stop_unfinished_jobs(_SESSION[0])


def stop_unfinished_jobs(session: CLI) -> list[str]:
    """`raytrain jobs stop` every unfinished job of the session cluster; the ids stopped."""
    stopped = unfinished_jobs(session.env)
    for job in stopped:
        session("jobs", "stop", job, timeout=120)
    left = unfinished_jobs(session.env)
    assert not left, f"jobs still unfinished after `jobs stop`: {left}"
    return stopped


def _is_e2e(item) -> bool:
    return item is not None and Path(str(item.fspath)).is_relative_to(HERE)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cold_start`` begin by stopping the cluster (they check that a command starts it): run
    them first among the e2e tests, while no cluster is up yet, so the stop costs nothing and the cluster they
    start serves the rest. Tests marked ``stops_cluster`` end with the cluster stopped: run them last, by
    their marker rather than by their names' order. Neither is needed for correctness (the ``cli`` fixture
    starts the cluster where it is down), only to save a restart."""
    e2e = [i for i, item in enumerate(items) if _is_e2e(item)]
    if not e2e:
        return
    block = [items[i] for i in e2e]
    cold = [item for item in block if item.get_closest_marker("cold_start")]
    last = [item for item in block if item.get_closest_marker("stops_cluster") and item not in cold]
    block = cold + [item for item in block if item not in cold and item not in last] + last
    items[e2e[0]:e2e[-1] + 1] = block + [item for item in items[e2e[0]:e2e[-1] + 1] if not _is_e2e(item)]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last e2e test, stop the session cluster at once rather than at the end of the session: the
    tests that follow (tests/multinode, their own two-node cluster) then do not share the cores with it."""
    if _is_e2e(item) and not _is_e2e(nextitem) and _SESSION:
        _SESSION[0]("cluster", "down", "--force", timeout=120)


GPT_Z3 = ["--workers", "2", "--zero", "3", "--precision", "fp32", "--grad-accum", "2", "--micro-batch", "2",
          "--checkpoint-every", "4"]


def submit_json(cli, job, flags, job_args, expect=0, timeout=300):
    proc = cli("submit", job, *flags, "--json", "--", *job_args, timeout=timeout)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(proc.stdout) if expect == 0 else proc


@pytest.fixture(scope="session")
def gpt_baseline(e2e_env, tmp_path_factory):
    """An uninterrupted ZeRO-3 run of ``jobs/gpt_zero.py`` (``GPT_Z3``, 10 steps; checkpoints [4, 8, 10]): its
    info, its facts and the engine's outputs on a probe. One for the session: the restart, preemption and export
    tests compare their runs with it (where or how often a run checkpoints does not change its weights)."""
    from tests.conftest import JOBS

    e2e_env("cluster", "up", "--num-cpus", "2", check=True, timeout=180)
    probe = tmp_path_factory.mktemp("probe") / "probe.pt"
    info = submit_json(e2e_env, JOBS / "gpt_zero.py", GPT_Z3, ["--steps", "10", "--probe-out", probe])
    facts = e2e_env.facts(info["id"])
    assert facts.checkpoints == [4, 8, 10], facts.checkpoints  # every 4 steps and at the end
    return info, facts, probe
