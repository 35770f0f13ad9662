"""``submit --k8s --cluster NAME``: a port-forward to a RayCluster's head, then the Ray Jobs API through it.

Like ``kubectl ray job submit``: the local job folder is uploaded as ``working_dir`` (and raytrain itself as
a ``py_module``), so nothing has to be baked into the image but Ray and deepspeed. The Jobs-API half is
``RayJobsApiTarget``; this module adds what it needs to reach the head: a port-forward (clusters/k8s_tunnel.py),
opened on first use, never by the dry run.
"""
from __future__ import annotations

from typing import Callable

from raytrain.capacity import Node
from raytrain.clusters.dashboard import user_token
from raytrain.clusters.k8s_auth import ClusterGuard
from raytrain.clusters.k8s_client import KubeConnection
from raytrain.clusters.k8s_manifests import STORAGE_ANNOTATION, nodes_from_spec, require_secret_env
from raytrain.clusters.k8s_names import check_name
from raytrain.clusters.k8s_tunnel import Forwarder, KubePortForward, PortForwardRequest, build_port_forward
from raytrain.clusters.raycluster import RayClusters, head_service_name
from raytrain.config.plan import Plan
from raytrain.errors import ClusterError
from raytrain.targets.base import JobHandle, Request
from raytrain.targets.kuberay_rayjob import K8sRequest
from raytrain.targets.ray_jobs_api import RayJobsApiTarget


class KubeRayPortForwardTarget(RayJobsApiTarget):
    """The Jobs API of an existing RayCluster, through a port-forward opened on first use."""

    kind = "kuberay-cluster"
    raytrain_nodes = False  # the pods start Ray from their image

    def __init__(
        self,
        conn: KubeConnection,
        *,
        ray_cluster: str,
        namespace: str | None = None,
        default_namespace: str | None = None,
        local_port: int = 0,
        python: str = "python",
        token: str | None = None,
        forwarder: Callable[[PortForwardRequest], Forwarder] | None = None,
        env_from_secret: dict[str, tuple[str, str]] | None = None,
    ):
        check_name("RayCluster", ray_cluster, flag="--cluster")
        self.conn = conn
        self.ray_cluster = ray_cluster
        self.namespace = conn.namespace(namespace, default_namespace)
        self.local_port = local_port
        self.env_from_secret = dict(env_from_secret or {})  # must already be in the RayCluster's pods
        self._forwarder_factory = forwarder or (lambda req: KubePortForward(self.conn.kube, req))
        self._forwarder: Forwarder | None = None
        self._raycluster: dict | None = None
        self._token = token if token is not None else user_token()
        placeholder = f"http://{head_service_name(ray_cluster)}.{self.namespace}.svc:8265"
        super().__init__(placeholder, token=self._token, python=python, ship_raytrain=True)

    # -- the RayCluster, read from the API server (read-only) ------------------------------------------
    def raycluster(self) -> dict:
        if self._raycluster is None:
            self._raycluster = RayClusters(self.conn, self.namespace).require(self.ray_cluster)
        return self._raycluster

    def port_forward_request(self) -> PortForwardRequest:
        return build_port_forward(self.raycluster(), self.local_port)

    nodes_without_connecting = True

    def nodes(self, request: Request | None = None) -> list[Node]:
        return nodes_from_spec(self.raycluster().get("spec") or {})

    def reconnect_flags(self) -> list[str]:
        # `jobs ... --k8s` alone means RayJobs; this job runs on a RayCluster's Jobs API
        return ["--k8s", "--cluster", self.ray_cluster, "--namespace", self.namespace]

    def default_storage(self) -> str | None:
        return ((self.raycluster().get("metadata") or {}).get("annotations") or {}).get(STORAGE_ANNOTATION)

    def dry_run(self, plan: Plan) -> K8sRequest:
        if self.env_from_secret:
            require_secret_env(self.raycluster(), self.env_from_secret, "--env-from-secret")
        forward = self.port_forward_request()
        base = super().dry_run(plan)
        fields = {k: getattr(base, k) for k in base.__dataclass_fields__}
        fields["address"] = forward.in_cluster_address
        return K8sRequest(**fields, namespace=self.namespace, port_forward=forward.to_dict())

    # -- the tunnel --------------------------------------------------------------------------------------
    def open(self) -> str:
        """Start the port-forward (once); the local address the Jobs client talks to."""
        if self._forwarder is None:
            forwarder = self._forwarder_factory(self.port_forward_request())
            local = forwarder.open()
            self._forwarder = forwarder
            self._connect(local, self.token())
        return self.address

    def token(self) -> str | None:
        """The token the Jobs client sends through the tunnel: RAY_AUTH_TOKEN(_PATH) if given, else the one
        in the RayCluster's Secret (raytrain made it at `cluster up`; reading it needs `get` on secrets)."""
        if self._token is None:
            try:
                self._token = ClusterGuard(self.conn.kube, self.namespace).read_token(self.ray_cluster)
            except ClusterError:  # no `get` on secrets here: a cluster that needs a token answers 401, which
                return None  # names RAY_AUTH_TOKEN
        return self._token

    def close(self) -> None:
        """End the port-forward: its local end (127.0.0.1) carries nothing afterwards. Opened again on next use."""
        forwarder, self._forwarder = self._forwarder, None
        if forwarder is not None:
            forwarder.close()

    def _ready(self) -> None:
        self.open()

    def check_versions(self, timeout_s: float | None = None) -> list[str]:
        self.open()  # the cluster's dashboard answers only through the tunnel
        return super().check_versions() if timeout_s is None else super().check_versions(timeout_s)

    def submit(self, request: Request) -> JobHandle:
        self.open()
        return super().submit(request)
