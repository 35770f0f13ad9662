"""End-to-end fixtures: one real local Ray cluster for the whole session, driven through the real CLI.

The cluster uses its own RAYTRAIN_HOME, temp dir and ports, so it never touches a developer's cluster,
and is stopped at the end of the session whatever happened.
"""
import json
import os
import shutil
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
        return JobFacts.from_lines(self("jobs", "logs", job_id, check=True).stdout.splitlines())


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
    try:
        yield cli
    finally:
        cli("cluster", "down", "--force", timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def cli(e2e_env):
    """The CLI with the session's local cluster running (started if an earlier test did not)."""
    e2e_env("cluster", "up", "--num-cpus", "2", check=True, timeout=180)
    return e2e_env
