"""The one place a cluster is chosen from options: the local cluster, or a KubeRay RayCluster (--k8s, or a
`kind: kuberay` profile). Nothing here imports the kubernetes client."""
from __future__ import annotations

from typing import Any, Callable

from raytrain.clusters.base import Cluster, ClusterOptions
from raytrain.clusters.profiles import K8sProfile, LocalProfile, default_k8s_profile, load_cluster_profile
from raytrain.errors import ConfigError

# Options of one kind only, with their flags (in the order they are checked).
K8S_ONLY = {"namespace": "--namespace", "context": "--context", "kubeconfig": "--kubeconfig", "name": "--name"}
LOCAL_ONLY = {
    "num_cpus": "--num-cpus", "num_gpus": "--num-gpus", "port": "--port", "dashboard_port": "--dashboard-port",
    "node_ip": "--node-ip", "resources": "--resources",
}


def make_cluster(options: ClusterOptions, local_jobs: Callable[[], list[Any]] | None = None) -> Cluster:
    """``local_jobs``: lists the local cluster's jobs (the caller's Target; clusters never import targets)."""
    profile = load_cluster_profile(options.profile) if options.profile else None
    if not (options.k8s or isinstance(profile, K8sProfile)):
        for name, flag in K8S_ONLY.items():
            if getattr(options, name):
                raise ConfigError(f"{flag} is a Kubernetes option: add --k8s", flag=flag)
        from raytrain.clusters.local import LocalRayCluster

        return LocalRayCluster(options, profile or LocalProfile(), local_jobs)
    for name, flag in LOCAL_ONLY.items():
        if getattr(options, name) is not None:
            raise ConfigError(f"{flag} is for the local cluster; a RayCluster's size comes from --profile", flag=flag)
    if isinstance(profile, LocalProfile):
        raise ConfigError(
            f"--profile {options.profile}: a `kind: local` profile cannot be used with --k8s", flag="--profile"
        )
    from raytrain.clusters.k8s_client import KubeConnection
    from raytrain.clusters.raycluster import KubeRayCluster

    return KubeRayCluster(
        KubeConnection(options.kubeconfig, options.context),
        profile=profile or default_k8s_profile(),
        name=options.name,
        namespace=options.namespace,
    )
