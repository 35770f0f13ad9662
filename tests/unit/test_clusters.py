"""One interface (up, status, down) for every kind of cluster; one factory picks the kind from the options."""
import pytest

from raytrain.clusters.base import ClusterOptions
from raytrain.clusters.factory import make_cluster
from raytrain.clusters.local import LocalRayCluster
from raytrain.clusters.raycluster import KubeRayCluster
from raytrain.errors import ClusterError, ConfigError
from tests.conftest import ROOT

EXAMPLE = str(ROOT / "cluster" / "k8s-example.yaml")


def test_the_factory_picks_the_kind(raytrain_home):
    assert isinstance(make_cluster(ClusterOptions()), LocalRayCluster)
    assert isinstance(make_cluster(ClusterOptions(k8s=True)), KubeRayCluster)
    by_profile = make_cluster(ClusterOptions(profile=EXAMPLE, name="mine"))  # `kind: kuberay` implies --k8s
    assert isinstance(by_profile, KubeRayCluster) and by_profile.name == "mine"
    assert by_profile.profile.workers.gpu == 8


@pytest.mark.parametrize("options, message", [
    (ClusterOptions(name="x"), "--name is a Kubernetes option: add --k8s"),
    (ClusterOptions(k8s=True, port=7000), "--port is for the local cluster"),
    (ClusterOptions(profile=EXAMPLE, resources="{}"), "--resources is for the local cluster"),
    (ClusterOptions(k8s=True, profile=str(ROOT / "cluster" / "local.yaml")), "a `kind: local` profile"),
])
def test_options_of_the_other_kind_are_refused(raytrain_home, options, message):
    with pytest.raises(ConfigError, match=message):
        make_cluster(options)


def test_the_local_cluster_when_nothing_runs(raytrain_home):
    local = make_cluster(ClusterOptions())
    assert local.status() == {"running": False}
    assert local.down() == "no local Ray cluster is running\n"
    with pytest.raises(ClusterError, match="--dry-run: only with --k8s"):
        local.up(dry_run=True)
