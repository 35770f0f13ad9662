"""The port-forward's local half: a listener on 127.0.0.1 that carries each connection over its own stream.

The stream to the pod (kubernetes.stream.portforward) is replaced by a TCP connection to a local HTTP server,
so this checks the listener and the byte pumping in both directions; tests/k8s builds the request.
"""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from raytrain.errors import ClusterError
from raytrain.clusters.dashboard import Dashboard
from raytrain.clusters.k8s_tunnel import KubePortForward, PortForwardRequest


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"ray_version": "2.60.0", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[::-1])

    def log_message(self, *args):
        pass


@pytest.fixture
def head():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


class Closer:
    closed = False

    def close(self):
        self.closed = True


class LocalStreams(KubePortForward):
    """KubePortForward whose streams to the pod are plain TCP connections to ``port``."""

    def __init__(self, port, pod="head-0"):
        super().__init__(kube=None, request=PortForwardRequest("ns", "c", "c-head-svc", port, "sel"))
        self.port, self.pod, self.streams = port, pod, []

    def head_pod(self):
        if self.pod is None:
            raise ClusterError("RayCluster c in ns has no running head pod yet")
        return self.pod

    def _remote(self):
        self.streams.append(Closer())
        return self.streams[-1], socket.create_connection(("127.0.0.1", self.port))


def test_connections_are_carried_both_ways(head):
    fwd = LocalStreams(head)
    address = fwd.open()
    try:
        assert address.startswith("http://127.0.0.1:") and not address.endswith(f":{head}")
        assert Dashboard(address).check_reachable()["ray_version"] == "2.60.0"
        payload = bytes(range(256)) * 4096  # 1 MiB up, 1 MiB back
        resp = requests.post(address + "/upload", data=payload, timeout=10)
        assert resp.content == payload[::-1]
        with requests.Session() as s:  # keep-alive: several requests over one carried connection
            assert [s.get(f"{address}/n/{i}", timeout=5).json()["path"] for i in range(3)] == ["/n/0", "/n/1", "/n/2"]
        assert len(fwd.streams) >= 3  # the probe in open(), then one stream per connection
    finally:
        fwd.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(address + "/after-close", timeout=2)


def test_no_head_pod_is_one_line():
    with pytest.raises(ClusterError, match="no running head pod"):
        LocalStreams(1, pod=None).open()


def test_only_this_users_connections_are_carried(head, monkeypatch):
    """Any local user can connect to 127.0.0.1: a connection the kernel says another uid made is closed."""
    import os

    from raytrain.clusters.k8s_tunnel import peer_uid

    fwd = LocalStreams(head)
    address = fwd.open()
    try:
        port = int(address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as probe:
            pass
        assert Dashboard(address).check_reachable()["ray_version"] == "2.60.0"
        mine = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: mine + 1)  # now every peer is "another user"
        with pytest.raises(requests.ConnectionError):
            requests.get(address + "/other-user", timeout=5)
        assert fwd.refused >= 1
    finally:
        fwd.close()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    assert peer_uid(conn) == mine  # the uid of the far end, read from /proc/net/tcp
    for s in (conn, client, server):
        s.close()


def test_close_ends_connections_in_flight_too(head):
    """A follow's log stream stays open for minutes: close() must not leave it carried."""
    fwd = LocalStreams(head)
    address = fwd.open()
    port = int(address.rsplit(":", 1)[1])
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"GET /kept HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: the connection stays
    conn.settimeout(5)
    got = b""
    while b'"/kept"}' not in got:  # the whole response (headers and body may come in two reads)
        chunk = conn.recv(65536)
        assert chunk, got
        got += chunk
    assert b"200" in got
    fwd.close()
    conn.settimeout(5)
    assert conn.recv(65536) == b""  # closed from the listener's side
    conn.close()
