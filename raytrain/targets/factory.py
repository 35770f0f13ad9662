"""The one place a target is built from options: the local cluster, any Ray Jobs address, or KubeRay.

Nothing here imports the kubernetes client: it is loaded only once a Kubernetes target talks to a cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

from raytrain import settings
from raytrain.errors import ConfigError
from raytrain.targets.base import Target

# The Kubernetes-only options, by field, with the flag that gives each (in the order they are checked).
K8S_FLAGS = {
    "cluster": "--cluster",
    "rayjob": "--rayjob",
    "working_dir": "--working-dir",
    "submission_id": "--submission-id",
    "env_from_secret": "--env-from-secret",
    "namespace": "--namespace",
    "context": "--context",
    "kubeconfig": "--kubeconfig",
}


@dataclass(frozen=True)
class TargetOptions:
    """Where a plan is submitted, or where jobs are looked up: the target-selection options."""

    address: str | None = None  # a Ray dashboard / Jobs API address; default $RAYTRAIN_ADDRESS, else local
    k8s: bool = False  # KubeRay on Kubernetes
    cluster: str | None = None  # k8s: the RayCluster (port-forward to its head, or the RayJob's selector)
    rayjob: bool = False  # k8s: a RayJob (code already on the cluster) instead of a port-forward
    profile: str | None = None  # k8s: cluster profile file (the RayJob's cluster, the namespace)
    working_dir: str | None = None  # k8s --rayjob: the job's folder as the cluster sees it
    submission_id: str | None = None  # k8s --rayjob: the RayJob's name
    env_from_secret: tuple[str, ...] = ()  # k8s: NAME=SECRET/KEY, the pods' env from a Secret
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None

    def refuse_k8s_options(self) -> None:
        """A Kubernetes-only option without --k8s is refused, naming its flag."""
        for name, flag in K8S_FLAGS.items():
            if getattr(self, name):
                raise ConfigError(f"{flag} is a Kubernetes option: add --k8s", flag=flag)


def parse_env_from_secret(pairs: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """``--env-from-secret NAME=SECRET/KEY`` (repeatable) -> {NAME: (SECRET, KEY)}."""
    import re

    out = {}
    for pair in pairs or ():
        name, _, ref = pair.partition("=")
        secret, _, key = ref.partition("/")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or not secret or not key:
            raise ConfigError(
                f"--env-from-secret {pair}: expected NAME=SECRET/KEY (e.g. WANDB_API_KEY=wandb/api-key)",
                flag="--env-from-secret",
            )
        out[name] = (secret, key)
    return out


def make_target(options: TargetOptions | None = None, *, auto_start: bool = True) -> Target:
    """The target the options name: --k8s (KubeRay), else --address / $RAYTRAIN_ADDRESS, else the local
    cluster (started on first submit unless ``auto_start`` is False). Invalid combinations are refused."""
    options = options or TargetOptions()
    if options.k8s:
        if options.address:
            raise ConfigError(
                "--address and --k8s: give one (unset RAYTRAIN_ADDRESS to use --k8s)", flag="--address"
            )
        return _kuberay_target(options)
    options.refuse_k8s_options()
    if options.profile:
        raise ConfigError("--profile is a Kubernetes option for submit: add --k8s", flag="--profile")
    address = options.address or settings.get("RAYTRAIN_ADDRESS")
    if address and address not in ("local", "auto"):
        from raytrain.targets.ray_jobs_api import RayJobsApiTarget

        return RayJobsApiTarget(address)
    from raytrain.targets.local import LocalTarget

    return LocalTarget(auto_start=auto_start)


def _kuberay_target(options: TargetOptions) -> Target:
    """A RayJob (--rayjob), else the Jobs API of a RayCluster through a port-forward to its head."""
    from raytrain.clusters.k8s_client import KubeConnection
    from raytrain.clusters.profiles import load_k8s_profile

    profile = load_k8s_profile(options.profile)
    conn = KubeConnection(options.kubeconfig, options.context)
    if options.rayjob:
        from raytrain.targets.kuberay_rayjob import KubeRayJobTarget

        return KubeRayJobTarget(
            conn,
            profile=profile,
            namespace=options.namespace,
            ray_cluster=options.cluster,
            working_dir=options.working_dir,
            submission_id=options.submission_id,
            env_from_secret=parse_env_from_secret(options.env_from_secret),
        )
    for name in ("working_dir", "submission_id"):
        if getattr(options, name):
            raise ConfigError(
                f"{K8S_FLAGS[name]} is for --rayjob; without it raytrain uploads the job's folder through a "
                "port-forward and picks the submission id", flag=K8S_FLAGS[name],
            )
    from raytrain.targets.kuberay_portforward import KubeRayPortForwardTarget

    return KubeRayPortForwardTarget(
        conn,
        ray_cluster=options.cluster or profile.name,
        namespace=options.namespace,
        default_namespace=profile.namespace,
        env_from_secret=parse_env_from_secret(options.env_from_secret),
    )


__all__ = ["K8S_FLAGS", "TargetOptions", "make_target"]
