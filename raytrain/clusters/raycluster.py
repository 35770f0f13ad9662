"""KubeRay RayClusters from cluster profiles: render, apply (server-side), status, delete; and a RayCluster
as a ``Cluster`` (`cluster up|status|down --k8s`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raytrain.capacity import Node
from raytrain.clusters.base import Cluster
from raytrain.clusters.k8s_client import KubeConnection, RayObjects, auth_options_known
from raytrain.clusters.k8s_auth import ClusterGuard
from raytrain.clusters.k8s_manifests import (
    DASHBOARD_PORT,
    KUBERAY_AUTH_VERSION,
    MANAGED_BY,
    STORAGE_ANNOTATION,
    auth_secret_name,
    nodes_from_spec,
    render_raycluster,
    security_manifests,
    to_yaml,
)
from raytrain.clusters.k8s_names import check_name
from raytrain.clusters.profiles import K8sProfile
from raytrain.errors import ClusterError


@dataclass
class ApplyResult:
    manifest: dict[str, Any]
    obj: dict[str, Any]
    action: str  # created | updated | unchanged


def secret_note(owner: str) -> str:
    return (f"# raytrain also creates Secret {auth_secret_name(owner)} with a fresh Ray auth token (not shown: "
            "pods read it through secretKeyRef)\n")


def head_service_name(cluster: str) -> str:
    """The head Service KubeRay creates for a RayCluster."""
    return f"{cluster}-head-svc"


def dashboard_port(obj: dict[str, Any]) -> int:
    """The head's dashboard port, from the RayCluster's rayStartParams or container ports (else 8265)."""
    head = (obj.get("spec") or {}).get("headGroupSpec") or {}
    port = (head.get("rayStartParams") or {}).get("dashboard-port")
    if port:
        return int(port)
    containers = (((head.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    for p in containers[0].get("ports") or []:
        if p.get("name") == "dashboard" and p.get("containerPort"):
            return int(p["containerPort"])
    return DASHBOARD_PORT


class RayClusters:
    """RayClusters in one namespace."""

    def __init__(self, conn: KubeConnection, namespace: str):
        self.conn = conn
        self.namespace = namespace

    @property
    def objects(self) -> RayObjects:
        return RayObjects(self.conn.kube, "rayclusters", self.namespace)

    def render(self, profile: K8sProfile, name: str) -> dict[str, Any]:
        return render_raycluster(profile, name, self.namespace)

    def apply(self, manifest: dict[str, Any]) -> ApplyResult:
        """Create or update (server-side apply); applying the same manifest twice changes nothing."""
        before = self.objects.get(manifest["metadata"]["name"])
        obj = self.objects.apply(manifest)
        if before is None:
            action = "created"
        elif before["metadata"].get("resourceVersion") == obj["metadata"].get("resourceVersion"):
            action = "unchanged"
        else:
            action = "updated"
        return ApplyResult(manifest, obj, action)

    def get(self, name: str) -> dict[str, Any] | None:
        check_name("RayCluster", name, flag="--name")
        return self.objects.get(name)

    def require(self, name: str, flag: str = "--cluster") -> dict[str, Any]:
        check_name("RayCluster", name, flag=flag)
        obj = self.objects.get(name)
        if obj is None:
            raise ClusterError(
                f"no RayCluster {name!r} in namespace {self.namespace}; "
                f"create it with `raytrain cluster up --k8s --name {name} --namespace {self.namespace}`"
            )
        return obj

    def delete(self, name: str) -> bool:
        check_name("RayCluster", name, flag="--name")
        return self.objects.delete(name)

    def nodes(self, name: str) -> list[Node]:
        return nodes_from_spec(self.require(name).get("spec") or {})

    def report(self, name: str) -> dict[str, Any]:
        """What `cluster status --k8s` prints."""
        obj = self.get(name)
        if obj is None:
            return {"exists": False, "name": name, "namespace": self.namespace}
        return describe(obj)


def describe(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    nodes = nodes_from_spec(spec)
    groups = []
    for g in spec.get("workerGroupSpecs") or []:
        containers = (((g.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
        groups.append(
            {
                "name": g.get("groupName"),
                "replicas": g.get("replicas"),
                "min_replicas": g.get("minReplicas"),
                "max_replicas": g.get("maxReplicas"),
                "limits": (containers[0].get("resources") or {}).get("limits") or {},
            }
        )
    return {
        "exists": True,
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "created": meta.get("creationTimestamp"),
        "state": status.get("state") or "pending",
        "reason": status.get("reason") or "",
        "desired_workers": status.get("desiredWorkerReplicas"),
        "available_workers": status.get("availableWorkerReplicas"),
        "head_service": head_service_name(meta.get("name", "")),
        "dashboard_port": dashboard_port(obj),
        "storage": (meta.get("annotations") or {}).get(STORAGE_ANNOTATION),
        "ray_version": spec.get("rayVersion"),
        "worker_groups": groups,
        "totals": {
            "cpus": sum(n.resources.get("CPU", 0) for n in nodes),
            "gpus": sum(n.resources.get("GPU", 0) for n in nodes),
        },
    }


class KubeRayCluster(Cluster):
    """One RayCluster (--name, default the profile's) in one namespace, built from a profile."""

    kind = "kuberay"

    def __init__(self, conn: KubeConnection, *, profile: K8sProfile, name: str | None = None, namespace: str | None = None):
        self.conn = conn
        self.profile = profile
        self.name = name or profile.name
        self._namespace_flag = namespace
        self._clusters: RayClusters | None = None

    @property
    def clusters(self) -> RayClusters:
        """The RayClusters of the namespace (--namespace, the profile's, else the kubeconfig context's)."""
        if self._clusters is None:
            namespace = self.conn.namespace(self._namespace_flag, self.profile.namespace)
            self._clusters = RayClusters(self.conn, namespace)
        return self._clusters

    def _refuse_foreign(self, obj: dict[str, Any] | None, doing: str) -> None:
        """raytrain changes only RayClusters it made (its managed-by label): never one someone else made."""
        labels = (obj or {}).get("metadata", {}).get("labels") or {}
        if obj is not None and labels.get(MANAGED_BY) != "raytrain":
            ns = self.clusters.namespace
            raise ClusterError(
                f"RayCluster {ns}/{self.name} was not made by raytrain (no {MANAGED_BY}=raytrain label); raytrain "
                f"does not {doing} it: choose another --name, or submit to it with `--k8s --cluster {self.name}`"
            )

    def up(self, *, dry_run: bool = False) -> str:
        clusters, name, profile = self.clusters, self.name, self.profile
        manifest = clusters.render(profile, name)
        if dry_run:
            return secret_note(name) + to_yaml([manifest, *security_manifests(name, clusters.namespace, profile)])
        self._refuse_foreign(clusters.get(name), "take over")
        note = (f"  note: this KubeRay has no spec.authOptions (KubeRay >= {KUBERAY_AUTH_VERSION} needed): Ray "
                "requires the token, but `submit --rayjob --cluster` is refused on this cluster\n")
        # KubeRay < 1.5.1 refuses the field; the Ray containers' own RAY_AUTH_* keep Ray authenticated
        # (raytrain's port-forward sends the token), but the operator cannot reach the dashboard (RayJobs).
        old_kuberay = not auth_options_known(self.conn.kube, "rayclusters")
        if old_kuberay:
            del manifest["spec"]["authOptions"]
        guard = ClusterGuard(self.conn.kube, clusters.namespace)
        guarded = guard.ensure(name, profile)
        try:
            result = clusters.apply(manifest)
        except ClusterError as exc:  # a CRD this user could not read, from before authOptions
            if old_kuberay or "authOptions" not in str(exc):
                raise
            del manifest["spec"]["authOptions"]
            old_kuberay = True
            result = clusters.apply(manifest)
        note = note if old_kuberay else ""
        if guarded:
            guard.adopt(name, result.obj)
        w = profile.workers
        gpu = f", {w.gpu} GPU" if w.gpu else ""
        ns = f" --namespace {clusters.namespace}"
        return (
            f"RayCluster {clusters.namespace}/{name} {result.action}: head {profile.head.cpu} CPU; "
            f"{w.replicas} x {w.group_name} ({w.cpu} CPU{gpu}, {w.memory})\n"
            f"  status: raytrain cluster status --k8s --name {name}{ns}\n"
            f"  submit: raytrain submit JOB.py --k8s --cluster {name}{ns}\n" + note
        )

    def status(self) -> dict[str, Any]:
        return self.clusters.report(self.name)

    def jobs_in_use(self) -> list[str]:
        """RayJobs that run on this RayCluster (clusterSelector) and have not ended."""
        from raytrain.status import rayjob_state

        rayjobs = RayObjects(self.conn.kube, "rayjobs", self.clusters.namespace)
        return [
            f"RayJob {(j.get('metadata') or {}).get('name')} ({rayjob_state(j.get('status')).value})"
            for j in rayjobs.list()
            if ((j.get("spec") or {}).get("clusterSelector") or {}).get("ray.io/cluster") == self.name
            and not rayjob_state(j.get("status")).terminal
        ]

    def down(self) -> str:
        clusters, name = self.clusters, self.name
        self._refuse_foreign(clusters.get(name), "delete")
        if clusters.delete(name):
            ClusterGuard(self.conn.kube, clusters.namespace).delete(name)  # also owned by it: no wait for GC
            return f"RayCluster {clusters.namespace}/{name} deleted (KubeRay removes its pods)\n"
        return f"no RayCluster {name!r} in namespace {clusters.namespace}\n"
