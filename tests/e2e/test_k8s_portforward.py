"""`submit --k8s --cluster NAME` end to end: a RayCluster held by the Kubernetes API server, raytrain's own
port-forward listener, and the real local Ray cluster behind it.

What is real: the RayCluster object (applied to the API server named by $RAYTRAIN_TEST_KUBECONFIG, and read
back by the target), the request and capacity check built from it, raytrain's port-forward (its
127.0.0.1 listener and the byte pumping of every connection), the upload of the job folder and of raytrain
itself, the Jobs API submit, the log and the final state. The one stand-in: no pod can run here, so each
carried connection goes to the local head's dashboard over TCP instead of a pod port-forward stream
(KubePortForward._remote); the pod stream itself needs a real cluster.
"""
import os
import socket
import sys

import pytest

from raytrain import api
from raytrain.clusters import local_head
from raytrain.clusters.k8s_client import KubeConnection
from raytrain.clusters.k8s_tunnel import KubePortForward
from raytrain.clusters.profiles import parse_cluster_profile
from raytrain.clusters.raycluster import RayClusters
from raytrain.config import Options
from raytrain.targets.kuberay_portforward import KubeRayPortForwardTarget
from tests.conftest import JOBS, needs

pytestmark = pytest.mark.e2e
KUBECONFIG = "RAYTRAIN_TEST_KUBECONFIG"


class StreamsToLocalHead(KubePortForward):
    """raytrain's port-forward, its pod streams replaced by TCP connections to the local head's dashboard."""

    opened: list = []

    def __init__(self, kube, request, port: int):
        super().__init__(kube, request)
        self.port = port
        StreamsToLocalHead.opened.append(request)

    def head_pod(self) -> str:
        return f"{self.request.cluster}-head"

    def _remote(self):
        class Stream:
            def close(self):
                pass

        return Stream(), socket.create_connection(("127.0.0.1", self.port))


@pytest.fixture
def kube_namespace():
    path = os.environ.get(KUBECONFIG)
    if not path:
        pytest.skip(needs("a Kubernetes API server",
                          f"${KUBECONFIG} is not set: the RayCluster must come from a Kubernetes API server "
                          "(../shared/k8s-apiserver/start.sh RUN_DIR prints one; .ci/run sets it)"))
    from tests.k8s.conftest import _ensure_crds

    conn = KubeConnection(path)
    _ensure_crds(conn.kube)
    namespace = f"rt-e2e-{os.getpid()}"
    yield conn, namespace
    RayClusters(conn, namespace).delete("local")


@pytest.fixture
def raycluster_local(cli, monkeypatch, kube_namespace):
    """The RayCluster "local" as `cluster up --k8s` writes it (2 CPUs of workers, a head that takes no work),
    applied to the API server; its connections go to the e2e cluster's head. (conn, namespace, head, the
    head's dashboard port)."""
    monkeypatch.setenv("RAYTRAIN_HOME", cli.env["RAYTRAIN_HOME"])
    head = local_head.current()
    assert head is not None, "the e2e cluster should be running"
    conn, namespace = kube_namespace
    profile = parse_cluster_profile(
        {"kind": "kuberay", "name": "local", "workers": {"group-name": "cpu", "cpu": 2, "gpu": 0, "replicas": 1}}
    )
    clusters = RayClusters(conn, namespace)
    clusters.apply(clusters.render(profile, "local"))
    return conn, namespace, head, int(head.dashboard_url.rsplit(":", 1)[1])


def test_a_raycluster_from_the_api_server_runs_a_job_through_raytrains_port_forward(tmp_path, raycluster_local):
    conn, namespace, head, dashboard_port = raycluster_local
    StreamsToLocalHead.opened.clear()

    target = KubeRayPortForwardTarget(
        conn, ray_cluster="local", namespace=namespace, python=sys.executable, token=head.token,
        forwarder=lambda request: StreamsToLocalHead(conn.kube, request, dashboard_port),
    )
    options = Options(job=str(JOBS / "cnn.py"), job_args=["--steps", "4"], workers=2, zero=1,
                      storage=str(tmp_path / "runs"))
    _, request = api.dry_run(options, target)
    assert not StreamsToLocalHead.opened  # the dry run opens no tunnel
    assert request.port_forward["service"] == "local-head-svc" and request.port_forward["remote_port"] == 8265
    assert request.runtime_env["working_dir"] == str(JOBS)
    assert request.runtime_env["py_modules"][0].endswith("raytrain")
    assert request.plan.scaling.use_gpu is False  # the RayCluster's workers have no GPU

    try:
        handle = api.submit_request(target, request)
        assert len(StreamsToLocalHead.opened) == 1
        assert handle.address.startswith("http://127.0.0.1:") and handle.address != head.dashboard_url  # the tunnel
        info = api.wait(handle, target)
        assert info.state.value == "succeeded"
        assert len(info.facts.losses) == 4
        listed = {i.job_id: i for i in target.list()}
        assert listed[handle.job_id].state.value == "succeeded"
    finally:
        target.close()


def test_submit_and_follow_through_the_cli_closes_the_port_forward(monkeypatch, tmp_path, raycluster_local):
    """`raytrain submit --k8s --cluster NAME` (following the job to its end, in-process): once the command has
    returned, the port-forward's local end (127.0.0.1, open to every local user) accepts nothing."""
    from click.testing import CliRunner

    from raytrain.cli.main import main
    from raytrain.targets import kuberay_portforward as k8s_portforward

    conn, namespace, head, dashboard_port = raycluster_local
    forwarders = []

    class ToLocalHead(KubeRayPortForwardTarget):  # what the CLI builds, its pod streams going to the local head
        def __init__(self, conn, **kw):
            def forwarder(request):
                forwarders.append(StreamsToLocalHead(conn.kube, request, dashboard_port))
                return forwarders[-1]

            super().__init__(conn, python=sys.executable, token=head.token, forwarder=forwarder, **kw)

    monkeypatch.setattr(k8s_portforward, "KubeRayPortForwardTarget", ToLocalHead)
    r = CliRunner().invoke(main, [
        "submit", str(JOBS / "cnn.py"), "--k8s", "--cluster", "local", "-n", namespace,
        "--kubeconfig", os.environ[KUBECONFIG], "--workers", "2", "--zero", "1", "--storage", str(tmp_path / "runs"),
        "--", "--steps", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "succeeded" in r.output and len(forwarders) == 1
    assert forwarders[0]._listener is None  # closed when the command ended
