"""`submit --k8s --cluster NAME`, the Jobs-API half, against the real local Ray cluster.

The port-forward to a KubeRay head cannot be opened here (no pods), so the forwarder is replaced by one
that hands out the local cluster's dashboard address; everything after it is the real path: the request
built from the RayCluster object, the capacity check against its spec, the upload of the job folder and of
raytrain itself (py_modules), the Jobs API submit, following the log and the final state.
"""
import sys

import pytest

from raytrain import api
from raytrain.config import Options
from raytrain.clusters import local_head
from raytrain.clusters.profiles import parse_cluster_profile
from raytrain.clusters.k8s_client import KubeConnection
from raytrain.clusters.k8s_manifests import render_raycluster
from raytrain.targets.k8s_portforward import RayClusterJobsTarget
from tests.conftest import JOBS

pytestmark = pytest.mark.e2e


def test_port_forward_target_submits_through_the_jobs_api(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("RAYTRAIN_HOME", cli.env["RAYTRAIN_HOME"])
    head = local_head.current()
    assert head is not None, "the e2e cluster should be running"

    # The RayCluster as the API server would hold it: 2 CPUs of workers, a head that takes no work.
    profile = parse_cluster_profile(
        {"kind": "kuberay", "name": "local", "workers": {"group-name": "cpu", "cpu": 2, "gpu": 0, "replicas": 1}}
    )
    opened = []

    class ToLocalHead:
        def __init__(self, request):
            opened.append(request)

        def open(self):
            return head.dashboard_url

        def close(self):
            pass

    target = RayClusterJobsTarget(
        KubeConnection(), ray_cluster="local", namespace="e2e", python=sys.executable, token=head.token,
        forwarder=ToLocalHead,
    )
    target._raycluster = render_raycluster(profile, "local", "e2e")

    options = Options(job=str(JOBS / "cnn.py"), job_args=["--steps", "4"], workers=2, zero=1,
                      storage=str(tmp_path / "runs"))
    _, request = api.dry_run(options, target)
    assert not opened  # the dry run opens no tunnel
    assert request.port_forward["service"] == "local-head-svc" and request.port_forward["remote_port"] == 8265
    assert request.runtime_env["working_dir"] == str(JOBS)
    assert request.runtime_env["py_modules"][0].endswith("raytrain")
    assert request.plan.scaling.use_gpu is False  # the RayCluster's workers have no GPU

    handle = api.submit_request(target, request)
    assert len(opened) == 1 and handle.address == head.dashboard_url
    info = api.wait(handle, target)
    assert info.state.value == "succeeded"
    assert len(info.facts.losses) == 4

    listed = {i.job_id: i for i in target.list()}
    assert listed[handle.job_id].state.value == "succeeded"
