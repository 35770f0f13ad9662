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
    assert compat.ray_version_problem("2.60.0", "http://h:8265") is None
    assert compat.ray_version_problem("2.60.3rc1", "http://h:8265") is None
    for other in ("2.58.1", "2.61.0", "3.0.0", "nightly", ""):
        problem = compat.ray_version_problem(other, "http://h:8265", "2.60.0")
        assert problem and "http://h:8265" in problem and "2.60.x" in problem and "2.60.0" in problem, problem
        assert "\n" not in problem


def test_the_range_is_the_one_pyproject_pins():
    import tomllib

    from tests.conftest import ROOT

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = next(d for d in deps if d.startswith("ray["))
    (a, b), (c, d) = compat.RAY_MINORS
    assert f">={a}.{b}" in ray and f"<{c}.{d + 1}" in ray, ray


class _Dashboard(BaseHTTPRequestHandler):
    version = "2.58.0"

    def do_GET(self):
        body = json.dumps({"version": "4", "ray_version": self.version}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_submitting_to_a_cluster_of_another_ray_is_refused_naming_both(tmp_path):
    from raytrain.targets.ray_jobs import RayJobsTarget

    server = HTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = RayJobsTarget(f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(ClusterError) as err:
            target.client
        text = str(err.value)
        assert "runs Ray 2.58.0" in text and "2.60.x" in text and compat.local_ray_version() in text
    finally:
        server.shutdown()


def test_a_kuberay_profile_with_another_ray_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_cluster_profile({"kind": "kuberay", "ray-version": "2.58.0", "image": "rayproject/ray:2.58.0"})
    assert "ray-version 2.58.0" in str(err.value) and "2.60.x" in str(err.value) and err.value.flag == "--profile"


def test_the_dry_run_says_which_ray_the_job_runs_against(raytrain_home):
    from click.testing import CliRunner

    from raytrain.cli.main import main
    from tests.conftest import ROOT

    job = str(ROOT / "jobs" / "cnn.py")
    local = json.loads(CliRunner().invoke(main, ["submit", job, "--dry-run", "--json"]).output)["ray"]
    assert local == {"this_machine": compat.local_ray_version(), "cluster": compat.local_ray_version(),
                     "needed": "2.60.x"}
    remote = CliRunner().invoke(main, ["submit", job, "--dry-run", "--address", "http://127.0.0.1:1"]).output
    assert "ray         the cluster's, checked at submit; raytrain needs 2.60.x" in remote, remote
