"""End-to-end fixtures: one real local Ray cluster for the whole session, driven through the real CLI.

The cluster uses its own RAYTRAIN_HOME, temp dir and ports, so it never touches a developer's cluster,
and is stopped at the end of the session whatever happened.
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
def e2e_env():
    home = Path(tempfile.mkdtemp(prefix="raytrain-e2e-"))
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths
    env = {
        **os.environ,
        "RAYTRAIN_HOME": str(home),
        "RAYTRAIN_RAY_TEMP_DIR": str(temp_dir),
        "RAYTRAIN_PORT": os.environ.get("RAYTRAIN_TEST_PORT", "6390"),
        "RAYTRAIN_DASHBOARD_PORT": os.environ.get("RAYTRAIN_TEST_DASHBOARD_PORT", "8275"),
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


@pytest.fixture
def cli(e2e_env):
    """The CLI with the session's local cluster running (started if an earlier test did not). The common
    case, a cluster an earlier test left running, is seen from its GCS and dashboard ports answering rather
    than from a `cluster up` run (a CLI process per test)."""
    env = e2e_env.env
    if not (_answers(env["RAYTRAIN_PORT"]) and _answers(env["RAYTRAIN_DASHBOARD_PORT"])):
        e2e_env("cluster", "up", "--num-cpus", "2", check=True, timeout=180)
    return e2e_env


def _is_e2e(item) -> bool:
    return item is not None and Path(str(item.fspath)).is_relative_to(HERE)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cold_start`` begin by stopping the cluster (they check that a command starts it): run
    them first among the e2e tests, while no cluster is up yet, so the stop costs nothing and the cluster they
    start serves the rest."""
    e2e = [i for i, item in enumerate(items) if _is_e2e(item)]
    if not e2e:
        return
    block = [items[i] for i in e2e]
    cold = [item for item in block if item.get_closest_marker("cold_start")]
    block = cold + [item for item in block if item not in cold]
    items[e2e[0]:e2e[-1] + 1] = block + [item for item in items[e2e[0]:e2e[-1] + 1] if not _is_e2e(item)]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last e2e test, stop the session cluster at once rather than at the end of the session: the
    tests that follow (tests/multinode, their own two-node cluster) then do not share the cores with it."""
    if _is_e2e(item) and not _is_e2e(nextitem) and _SESSION:
        _SESSION[0]("cluster", "down", "--force", timeout=120)
