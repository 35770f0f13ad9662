"""A cluster whose Ray raytrain's runtime cannot run on is refused before anything is submitted, in one line
naming both versions."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from raytrain import compat
from raytrain.clusters.profiles import parse_cluster_profile
from raytrain.errors import ClusterError, ConfigError


def test_the_supported_minor_releases_pass_and_others_are_named():
    for ok in ("2.58.0", "2.59.0", "2.60.0", "2.60.3rc1"):
        assert compat.ray_version_problem(ok, "http://h:8265") is None, ok
    for other in ("2.57.1", "2.0.0", "1.13.0", "3.0.0", "nightly", ""):
        problem = compat.ray_version_problem(other, "http://h:8265", "2.60.0")
        assert problem and "http://h:8265" in problem and "2.58.x to 2.60.x" in problem and "2.60.0" in problem, problem
        assert "\n" not in problem


def test_the_next_ray_minor_is_accepted_with_a_warning():
    """The next Ray release must work the day it ships, without a code change: not refused, one line said."""
    assert compat.ray_version_problem("2.61.0", "http://h:8265") is None
    problem, warnings = compat.check_versions({"ray": "2.61.0"}, "http://h:8265")
    assert problem is None and len(warnings) == 1
    assert "Ray 2.61.0" in warnings[0] and "2.58.x to 2.60.x" in warnings[0]


@pytest.mark.parametrize("component, old, new", [
    ("python", "3.9.18", "3.12.1"), ("torch", "2.3.1", "2.16.0"), ("deepspeed", "0.17.6", "0.20.1")])
def test_each_component_refuses_older_and_warns_newer(component, old, new):
    here = {"python": "3.11.7", "torch": "2.15.0", "deepspeed": "0.19.8"}[component]
    problem, _ = compat.check_versions({component: old}, "http://h:8265", {component: here})
    label = compat.LABELS[component]
    assert problem.startswith(f"the cluster at http://h:8265 runs {label} {old}; raytrain's runtime needs {label} ")
    assert compat.supported(component) in problem and f"this machine has {here}" in problem and "\n" not in problem
    assert compat.check_versions({component: new}, "http://h:8265")[0] is None
    assert compat.check_versions({component: new}, "http://h:8265")[1]
    good = {"python": "3.11.7", "torch": "2.13.0+cpu", "deepspeed": "0.19.3"}[component]
    assert compat.check_versions({component: good}, "http://h:8265") == (None, [])


def test_deepspeed_0_18_is_accepted_with_every_supported_torch():
    """DeepSpeed 0.18.x runs with raytrain's fixes (runtime/worker/deepspeed_compat.py) on torch 2.4 to 2.15."""
    for torch in ("2.4.1", "2.13.0+cpu", "2.15.0+cu132"):
        assert compat.check_versions({"torch": torch, "deepspeed": "0.18.9"}, "http://h:8265") == (None, [])
    problem, _ = compat.check_versions({"deepspeed": "0.17.6"}, "http://h:8265", {"deepspeed": "0.18.9"})
    assert "DeepSpeed 0.18.x to 0.19.x" in problem and "pip install 'deepspeed>=0.18'" in problem, problem


def test_a_missing_torch_or_deepspeed_is_refused_in_one_line_naming_all_it_needs():
    problem, _ = compat.check_versions(
        {"ray": "2.60.0", "python": "3.11.7", "torch": None, "deepspeed": None}, "http://h:8265",
        compat.local_versions())
    assert problem.startswith("the cluster at http://h:8265 has no torch; raytrain's runtime needs torch 2.4.x to 2.15.x")
    assert "pip install 'torch>=2.4'" in problem and "it also needs DeepSpeed 0.18.x to 0.19.x" in problem
    assert "\n" not in problem


def test_the_probe_reports_this_interpreter_without_importing_anything_heavy():
    import subprocess
    import sys

    code = compat.PROBE_CODE + "import sys; print(sorted(m for m in ('torch', 'ray', 'deepspeed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert compat.parse_probe(out) == compat.local_versions()
    assert out.strip().endswith("[]")
    assert compat.parse_probe("no line here") is None


def test_the_range_is_the_one_pyproject_pins():
    import tomllib

    from tests.conftest import ROOT

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = next(d for d in deps if d.startswith("ray["))
    (a, b), (c, d) = compat.RAY_MINORS
    assert f">={a}.{b}" in ray and f"<{c}.{d + 1}" in ray, ray


class _Dashboard(BaseHTTPRequestHandler):
    version = "2.57.1"

    def do_GET(self):
        body = json.dumps({"version": "4", "ray_version": self.version}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_submitting_to_a_cluster_of_another_ray_is_refused_naming_both(tmp_path):
    from raytrain.targets.ray_jobs_api import RayJobsApiTarget

    server = HTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = RayJobsApiTarget(f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(ClusterError) as err:
            target.client
        text = str(err.value)
        assert "runs Ray 2.57.1" in text and "2.58.x to 2.60.x" in text and compat.local_ray_version() in text
    finally:
        server.shutdown()


def test_a_cluster_that_does_not_run_the_probe_is_submitted_to_with_the_reason_said():
    """A dashboard of a supported Ray whose Jobs API refuses the probe job: not refused, the reason said."""
    from raytrain.targets.ray_jobs_api import RayJobsApiTarget

    class Supported(_Dashboard):
        version = "2.59.0"

    server = HTTPServer(("127.0.0.1", 0), Supported)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        said = RayJobsApiTarget(f"http://127.0.0.1:{server.server_port}").check_versions(timeout_s=2)
        assert len(said) == 1 and said[0].startswith("could not learn the cluster's Python, torch and DeepSpeed: "
                                                     "the Jobs API at http://127.0.0.1:"), said
        assert "refused the probe job (HTTP 501)" in said[0] and "submitting anyway" in said[0]
    finally:
        server.shutdown()


def test_a_kuberay_profile_with_another_ray_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_cluster_profile({"kind": "kuberay", "ray-version": "2.57.1", "image": "rayproject/ray:2.57.1"})
    assert "ray-version 2.57.1" in str(err.value) and "2.58.x to 2.60.x" in str(err.value)
    assert err.value.flag == "--profile"


def test_the_dry_run_says_which_versions_the_job_runs_against(raytrain_home):
    from click.testing import CliRunner

    from raytrain.cli.main import main
    from tests.conftest import ROOT

    job = str(ROOT / "jobs" / "cnn.py")
    here = compat.local_versions()
    out = json.loads(CliRunner().invoke(main, ["submit", job, "--dry-run", "--json"]).output)
    assert out["ray"] == {"this_machine": here["ray"], "cluster": here["ray"], "needed": "2.58.x to 2.60.x"}
    assert {c: v["cluster"] for c, v in out["versions"].items()} == here
    assert out["versions"]["torch"]["needed"] == "2.4.x to 2.15.x"
    text = CliRunner().invoke(main, ["submit", job, "--dry-run"]).output
    assert f"torch       {here['torch']}; raytrain needs 2.4.x to 2.15.x; this machine has {here['torch']}" in text
    remote = CliRunner().invoke(main, ["submit", job, "--dry-run", "--address", "http://127.0.0.1:1"]).output
    assert "ray         the cluster's, checked at submit; raytrain needs 2.58.x to 2.60.x" in remote, remote
    assert "deepspeed   the cluster's, checked at submit; raytrain needs 0.18.x to 0.19.x" in remote, remote
