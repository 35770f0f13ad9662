"""A port-forward to a RayCluster's head, as `kubectl port-forward svc/HEAD` does it: the request, built from
the RayCluster object (pure), and a small local listener that carries each connection over the API server's
pod port-forward (the head Service is ClusterIP and stays unexposed).
"""
from __future__ import annotations

import select
import socket
import threading
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from raytrain.clusters.k8s_client import Kube, NotFound
from raytrain.clusters.k8s_names import check_name
from raytrain.clusters.raycluster import dashboard_port, head_service_name
from raytrain.errors import ClusterError


@dataclass(frozen=True)
class PortForwardRequest:
    """What `kubectl port-forward -n NAMESPACE svc/SERVICE LOCAL:REMOTE` would do."""

    namespace: str
    cluster: str
    service: str  # the head Service (ClusterIP)
    remote_port: int  # the head's dashboard / Jobs API port
    pod_selector: str  # the Service's pods: the head pod of this RayCluster
    local_port: int = 0  # 0: any free port on 127.0.0.1

    @property
    def in_cluster_address(self) -> str:
        return f"http://{self.service}.{self.namespace}.svc:{self.remote_port}"

    def kubectl(self) -> str:
        return f"kubectl port-forward -n {self.namespace} svc/{self.service} {self.local_port or ''}:{self.remote_port}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_port_forward(raycluster: dict[str, Any], local_port: int = 0) -> PortForwardRequest:
    """The port-forward to a RayCluster's head dashboard, from the RayCluster object. Pure."""
    meta = raycluster.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    check_name("RayCluster", name, flag="--cluster")
    if not 0 <= int(local_port) < 65536:
        raise ClusterError(f"local port {local_port}: must be 0-65535")
    return PortForwardRequest(
        namespace=namespace,
        cluster=name,
        service=head_service_name(name),
        remote_port=dashboard_port(raycluster),
        pod_selector=f"ray.io/cluster={name},ray.io/node-type=head",
        local_port=int(local_port),
    )


class Forwarder(Protocol):
    def open(self) -> str:
        """Start forwarding; the local http:// address of the remote port."""

    def close(self) -> None: ...


class KubePortForward:
    """A local TCP listener; each connection is carried over its own pod port-forward (websocket) stream."""

    def __init__(self, kube: Kube, request: PortForwardRequest):
        self.kube = kube
        self.request = request
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._pod: str | None = None
        self._api = None

    def head_pod(self) -> str:
        r = self.request
        try:
            pods = self.kube.call(
                f"list the head pod of RayCluster {r.namespace}/{r.cluster}", self.kube.core.list_namespaced_pod,
                r.namespace, label_selector=r.pod_selector,
            )
        except NotFound as exc:
            raise ClusterError(
                f"cannot list pods in namespace {r.namespace} on {self.kube.server} (HTTP 404): "
                "this API server serves no Pods, so there is no head pod to port-forward to"
            ) from exc
        running = [
            p["metadata"]["name"]
            for p in pods.get("items") or []
            if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        if not running:
            raise ClusterError(
                f"RayCluster {r.cluster} in {r.namespace} has no running head pod yet "
                f"(pods: {r.pod_selector}); wait until `raytrain cluster status --k8s --name {r.cluster}` says ready"
            )
        return sorted(running)[0]

    def _remote(self):
        """A new stream to the head pod's port: (the PortForward, its socket)."""
        from kubernetes import client
        from kubernetes.stream import portforward

        with self._lock:  # portforward() swaps the ApiClient's transport while it connects
            if self._api is None:  # a dedicated ApiClient: the port-forward call patches the one it runs on
                self._api = client.CoreV1Api(client.ApiClient(self.kube.api_client.configuration))
            try:
                pf = portforward(
                    self._api.connect_get_namespaced_pod_portforward, self._pod, self.request.namespace,
                    ports=str(self.request.remote_port),
                )
            except client.exceptions.ApiException as exc:
                raise ClusterError(
                    f"port-forward to pod {self.request.namespace}/{self._pod}:{self.request.remote_port} failed: "
                    f"{exc.reason or exc.status}"
                ) from exc
        sock = pf.socket(self.request.remote_port)
        sock.setblocking(True)
        return pf, sock

    def open(self) -> str:
        self._pod = self.head_pod()
        pf, sock = self._remote()  # fail here, in one line, rather than inside the Jobs client
        sock.close()
        pf.close()
        self._listener = socket.create_server(("127.0.0.1", self.request.local_port))
        port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="raytrain-port-forward", daemon=True).start()
        return f"http://127.0.0.1:{port}"

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn: socket.socket) -> None:
        try:
            pf, remote = self._remote()
        except ClusterError:
            conn.close()
            return
        try:
            while True:
                readable, _, _ = select.select([conn, remote], [], [], 5.0)
                for src in readable:
                    data = src.recv(65536)
                    if not data:
                        return
                    (remote if src is conn else conn).sendall(data)
        except OSError:
            return
        finally:
            conn.close()
            remote.close()
            pf.close()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the listener thread
            except OSError:
                pass
            listener.close()
