"""`submit --k8s --cluster NAME`: the port-forward request, built from the RayCluster the API server holds.

No pod can be reached here, so the tunnel itself is tested in tests/unit/test_k8s_tunnel.py (over a
local socket) and the Jobs-API half in tests/e2e/test_k8s_portforward.py (against the real local Ray cluster).
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from raytrain.config import Options, resolve
from raytrain.errors import ClusterError
from raytrain.clusters.k8s_client import KubeConnection
from raytrain.clusters.k8s_tunnel import KubePortForward, build_port_forward
from raytrain.targets.kuberay_portforward import KubeRayPortForwardTarget
from tests.conftest import JOBS, ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"
CNN = JOBS / "cnn.py"


@pytest.fixture
def head_on_8266(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["head"]["ray-start-params"] = {"dashboard-port": "8266"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_port_forward_request_from_the_raycluster(cli, namespace, rayclusters, head_on_8266):
    assert cli("cluster", "up", "--profile", EXAMPLE, "-n", namespace, "--name", "plain").exit_code == 0
    assert cli("cluster", "up", "--profile", head_on_8266, "-n", namespace, "--name", "custom").exit_code == 0

    plain = build_port_forward(rayclusters.get("plain"))
    assert plain.to_dict() == {
        "namespace": namespace, "cluster": "plain", "service": "plain-head-svc", "remote_port": 8265,
        "pod_selector": "ray.io/cluster=plain,ray.io/node-type=head", "local_port": 0,
    }
    assert plain.in_cluster_address == f"http://plain-head-svc.{namespace}.svc:8265"
    assert plain.kubectl() == f"kubectl port-forward -n {namespace} svc/plain-head-svc :8265"
    assert build_port_forward(rayclusters.get("custom"), local_port=18265).remote_port == 8266


def test_dry_run_shows_the_port_forward_and_the_jobs_api_request(cli, namespace, head_on_8266, raytrain_home):
    assert cli("cluster", "up", "--profile", head_on_8266, "-n", namespace, "--name", "pf").exit_code == 0
    r = cli("submit", CNN, "--k8s", "--cluster", "pf", "-n", namespace, "--workers", "2", "--gpus-per-worker", "1",
            "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# Nothing is applied to the cluster")
    doc = yaml.safe_load(r.output)
    assert doc["portForward"]["service"] == "pf-head-svc" and doc["portForward"]["remote_port"] == 8266
    sub = doc["jobSubmission"]
    assert sub["address"] == f"http://pf-head-svc.{namespace}.svc:8266"
    assert sub["entrypoint"] == "python -m raytrain.runtime.driver.entrypoint"
    assert sub["runtime_env"]["working_dir"] == str(JOBS)  # the local folder is uploaded
    assert sub["runtime_env"]["py_modules"][0].endswith("raytrain")  # and raytrain itself
    assert ".kube" in sub["runtime_env"]["excludes"] and "*.kubeconfig" in sub["runtime_env"]["excludes"]
    plan = json.loads(sub["runtime_env"]["env_vars"]["RAYTRAIN_PLAN"])
    assert plan["storage"] == "/mnt/checkpoints" and plan["scaling"]["use_gpu"] is True

    out = json.loads(cli("submit", CNN, "--k8s", "--cluster", "pf", "-n", namespace, "--dry-run", "--json").output)
    assert out["target"] == "kuberay-cluster" and out["port_forward"]["remote_port"] == 8266
    assert out["plan"]["scaling"]["use_gpu"] is True  # GPUs by default: the RayCluster's workers have them


def test_a_missing_raycluster_is_refused(cli, namespace):
    r = cli("submit", CNN, "--k8s", "--cluster", "absent", "-n", namespace, "--dry-run")
    assert r.exit_code == 2 and f"no RayCluster 'absent' in namespace {namespace}" in r.output
    r = cli("submit", CNN, "--k8s", "--cluster", "absent", "-n", namespace, "--no-wait")
    assert r.exit_code == 2 and "no RayCluster 'absent'" in r.output


def test_capacity_is_checked_against_the_raycluster_before_any_connection(cli, namespace):
    assert cli("cluster", "up", "--profile", EXAMPLE, "-n", namespace, "--name", "small").exit_code == 0
    r = cli("submit", CNN, "--k8s", "--cluster", "small", "-n", namespace, "--workers", "17", "--no-wait")
    assert r.exit_code == 2 and "room for 16 worker(s)" in r.output, r.output


class _Dashboard(BaseHTTPRequestHandler):
    """What the far end of the tunnel answers: a Ray dashboard's version and an empty job list."""

    paths: list = []

    def do_GET(self):
        _Dashboard.paths.append(self.path)
        data = {"version": "4", "ray_version": "2.60.0", "ray_commit": "test"} if self.path == "/api/version" else []
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def far_end():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Dashboard.paths.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_tunnel_opens_through_the_forwarder_and_the_jobs_client_uses_it(kubeconfig, kube, namespace, cli,
                                                                             far_end):
    """The forwarder is a stand-in (no pod to forward to here) that hands out the address of a small HTTP
    server; the Jobs client raytrain builds afterwards must talk to that address, and only to it."""
    assert cli("cluster", "up", "--profile", EXAMPLE, "-n", namespace, "--name", "tun").exit_code == 0
    opened = []

    class Stub:
        def __init__(self, request):
            opened.append(request)

        def open(self):
            return far_end

        def close(self):
            pass

    target = KubeRayPortForwardTarget(KubeConnection(kubeconfig), ray_cluster="tun", namespace=namespace, forwarder=Stub)
    request = target.dry_run(resolve(Options(job=str(CNN), workers=2), cluster_has_gpus=True))
    assert request.address == f"http://tun-head-svc.{namespace}.svc:8265" and not opened  # dry run: no tunnel
    assert not _Dashboard.paths
    assert target.open() == far_end
    assert target.open() == far_end and len(opened) == 1  # opened once
    assert opened[0].service == "tun-head-svc" and opened[0].remote_port == 8265

    client = target.client  # Ray's JobSubmissionClient, built through the tunnel
    assert client.get_address() == far_end
    assert target.list() == []  # the job list came through the tunnel too
    assert "/api/version" in _Dashboard.paths and any(p.startswith("/api/jobs") for p in _Dashboard.paths)


def test_no_pods_api_is_one_line(kube, namespace, cli):
    """The loopback server serves no Pods: the real forwarder says so in one line (a real cluster lists them)."""
    assert cli("cluster", "up", "--profile", EXAMPLE, "-n", namespace, "--name", "nopods").exit_code == 0
    from raytrain.clusters.k8s_client import RayObjects

    request = build_port_forward(RayObjects(kube, "rayclusters", namespace).get("nopods"))
    try:
        KubePortForward(kube, request).head_pod()
    except ClusterError as exc:
        assert "\n" not in str(exc)
        assert "no running head pod" in str(exc) or "serves no Pods" in str(exc)
    else:  # a real cluster without KubeRay's operator has no head pod either
        pytest.fail("expected a ClusterError")


def test_the_cli_closes_the_port_forward_when_the_command_ends(cli, namespace, far_end, monkeypatch):
    """The local end (127.0.0.1, open to every local user) lives only as long as the command needs it."""
    import socket

    from raytrain.targets import kuberay_portforward as k8s_portforward

    assert cli("cluster", "up", "--profile", EXAMPLE, "-n", namespace, "--name", "closes").exit_code == 0
    port = int(far_end.rsplit(":", 1)[1])
    opened = []

    class ToFarEnd(KubePortForward):  # raytrain's listener; its pod streams go to the stand-in dashboard
        def __init__(self, kube, request):
            super().__init__(kube, request)
            opened.append(self)

        def head_pod(self):
            return "closes-head"

        def _remote(self):
            class Stream:
                def close(self):
                    pass

            return Stream(), socket.create_connection(("127.0.0.1", port))

    monkeypatch.setattr(k8s_portforward, "KubePortForward", ToFarEnd)
    r = cli("jobs", "list", "--k8s", "--cluster", "closes", "-n", namespace, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == [] and len(opened) == 1
    assert any(p.startswith("/api/jobs") for p in _Dashboard.paths)  # the listing went through the tunnel
    assert opened[0]._listener is None  # closed when the command ended
