"""A port-forward to a RayCluster's head, as `kubectl port-forward svc/HEAD` does it: the request, built from
the RayCluster object (pure), and a small local listener that carries each connection over the API server's
pod port-forward (the head Service is ClusterIP and stays unexposed).
"""
from __future__ import annotations

import os
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


def _proc_net_address(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex, then the port)."""
    return f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the far end of a loopback TCP connection (Linux: /proc/net/tcp); None where unknown."""
    try:
        peer, ours = conn.getpeername(), conn.getsockname()
        lines = open("/proc/net/tcp").read().splitlines()[1:]
    except OSError:
        return None
    # the client's socket: local address = our peer, remote address = our end
    want = (_proc_net_address(peer[0], peer[1]), _proc_net_address(ours[0], ours[1]))
    for line in lines:
        cols = line.split()
        if len(cols) > 7 and (cols[1], cols[2]) == want:
            return int(cols[7])
    return None


class KubePortForward:
    """A local TCP listener on 127.0.0.1; each connection is carried over its own pod port-forward (websocket)
    stream. Any local user could connect to 127.0.0.1, so where the kernel says who connected (Linux), only
    this user's connections are carried; close() ends the listener and every connection it carries."""

    def __init__(self, kube: Kube, request: PortForwardRequest):
        self.kube = kube
        self.request = request
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._pod: str | None = None
        self._api = None
        self._conns: set[socket.socket] = set()
        self.refused = 0  # connections from another user, closed unanswered

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
        uid = peer_uid(conn)
        if uid is not None and uid != os.getuid():
            self.refused += 1
            conn.close()
            return
        with self._lock:
            if self._listener is None:  # closed meanwhile
                conn.close()
                return
            self._conns.add(conn)
        try:
            pf, remote = self._remote()
        except ClusterError:
            self._conns.discard(conn)
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
            self._conns.discard(conn)
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
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:  # a follow's log stream, a keep-alive connection: nothing is carried after close
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
