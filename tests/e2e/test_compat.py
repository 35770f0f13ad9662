"""The cluster's versions, checked before submitting (issue 39), against the real session cluster reached as any
Ray cluster is (`--address`, its dashboard, its token): the same versions are accepted and the dry run names
them; a cluster whose jobs run a Python without torch or DeepSpeed is refused in one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain import compat
from raytrain.clusters import ray_process

pytestmark = pytest.mark.e2e

SLEEPY = Path(__file__).parent / "jobs" / "sleepy.py"


def _as_remote(cli) -> tuple[str, dict]:
    """The session cluster's dashboard address and an env that reaches it as a remote cluster's user would."""
    record = json.loads((Path(cli.env["RAYTRAIN_HOME"]) / ray_process.RECORDS["head"]).read_text())
    return record["dashboard_url"], {**cli.env, "RAY_AUTH_TOKEN_PATH": record["token_path"]}


def test_a_cluster_of_the_same_versions_is_accepted_and_the_dry_run_names_them(cli):
    """The job entrypoints of a cluster reached by --address run `python` from the cluster's PATH: the dry run
    names what that interpreter has (the cluster's own Ray from its dashboard); a target whose entrypoints run
    this very interpreter (as the local cluster's do) is accepted without a warning, and its submit goes on."""
    import shutil

    from raytrain.api import dry_run, submit_request
    from raytrain.config import Options
    from raytrain.targets.ray_jobs_api import RayJobsApiTarget

    address, env = _as_remote(cli)
    here = compat.local_versions()
    run = lambda *args: subprocess.run([sys.executable, "-m", "raytrain.cli.main", *map(str, args)], env=env,
                                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    dry = run("submit", SLEEPY, "--address", address, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    versions = json.loads(dry.stdout)["versions"]
    assert versions["ray"]["cluster"] == here["ray"] and versions["ray"]["known"], versions
    # the probe is bounded (8 s): on an overloaded machine its job may not have started by then
    if versions["torch"]["known"] and shutil.which("python", path=env.get("PATH")):  # the cluster's PATH
        probe = subprocess.run(["python", "-c", compat.PROBE_CODE], env=env, capture_output=True, text=True,
                               timeout=60).stdout
        expected = {**compat.parse_probe(probe), "ray": here["ray"]}
        assert {c: v["cluster"] for c, v in versions.items()} == expected, versions
    text = run("submit", SLEEPY, "--address", address, "--dry-run").stdout
    assert f"ray         {here['ray']}; raytrain needs 2.58.x to 2.60.x; this machine has {here['ray']}" in text, text

    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    target = RayJobsApiTarget(address, token=token, python=sys.executable)
    assert target.cluster_versions(timeout_s=120)[0] == here
    assert target.check_versions(timeout_s=120) == []
    _, request = dry_run(Options(job=str(SLEEPY), workers=1, job_args=["1"]), target)
    handle = submit_request(target, request)
    assert handle.job_id in _job_ids(target)
    probes = [j for j in _jobs(target) if j["submission_id"].startswith("raytrain-versions-")]
    # each probe ended, or was stopped where it outlived its bound: none is left running (the CLI's probes run
    # `python` from the cluster's PATH: where there is none, as for a user without one, they fail)
    ended = ("SUCCEEDED", "STOPPED") + (() if shutil.which("python", path=env.get("PATH")) else ("FAILED",))
    assert probes and all(j["status"] in ended for j in probes), probes
    assert any(j["status"] == "SUCCEEDED" for j in probes), probes
    assert not [line for line in cli("jobs", "list").stdout.splitlines() if "raytrain-versions-" in line]


def test_a_cluster_whose_jobs_have_no_torch_is_refused_in_one_line(cli, tmp_path):
    """The cluster's job entrypoints run an interpreter with nothing installed (a bare venv): the probe job
    reports it, and the submit is refused before anything is sent, naming both versions and what to do. (A Ray
outside the range is refused from the dashboard's answer alone, in a few seconds: docs/compatibility.md.)"""
    from raytrain.errors import ClusterError
    from raytrain.targets.ray_jobs_api import RayJobsApiTarget

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    address, env = _as_remote(cli)
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    target = RayJobsApiTarget(address, token=token, python=str(bare / "bin" / "python"))
    before = set(_job_ids(target))
    with pytest.raises(ClusterError) as err:  # a long bound: the time a refusal takes is not under test here
        said = target.check_versions(timeout_s=120)
        pytest.fail(f"not refused; said {said}")
    text = str(err.value)
    here = compat.local_versions()
    assert text.startswith(f"the cluster at {address} has no torch; raytrain's runtime needs torch 2.4.x to 2.15.x "
                           f"(this machine has {here['torch']})"), text
    assert "it also needs Ray" not in text and "DeepSpeed 0.18.x to 0.19.x" in text and "\n" not in text, text
    after = {j["submission_id"]: j for j in _jobs(target) if j["submission_id"] not in before}
    assert len(after) == 1 and all(i.startswith("raytrain-versions-") for i in after), after  # the probe only


def _jobs(target) -> list[dict]:
    return [j for j in target.dashboard.get("/api/jobs/", timeout=15) if j.get("submission_id")]


def _job_ids(target) -> list[str]:
    return [j["submission_id"] for j in _jobs(target)]
