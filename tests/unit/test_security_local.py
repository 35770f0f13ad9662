"""The local head: ports checked before `ray start`, the token only sent to our own Ray, a fresh token at
each `cluster up`, loopback unless --node-ip."""
import os
import socket
import stat
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.clusters import local_head, ports, ray_process
from raytrain.errors import ClusterError


def _listener(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    s.listen(8)
    return s, s.getsockname()[1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Spawned(Exception):
    pass


@pytest.fixture
def no_spawn(raytrain_home, tmp_path, monkeypatch):
    """Record what `cluster up` would start instead of starting Ray."""
    monkeypatch.setenv("RAYTRAIN_RAY_TEMP_DIR", str(tmp_path / "rt"))
    calls = []

    def spawn(args, **kwargs):
        calls.append((args, kwargs))
        raise Spawned()

    monkeypatch.setattr(ray_process, "spawn", spawn)
    return calls


def test_a_taken_port_is_refused_before_ray_starts(no_spawn):
    sock, port = _listener()
    with sock:
        with pytest.raises(ClusterError, match=rf"port {port} \(port\) is already in use.*--port or RAYTRAIN_PORT"):
            local_head.up(port=port, dashboard_port=_free_port())
        with pytest.raises(ClusterError, match=rf"port {port} \(dashboard-port\).*RAYTRAIN_DASHBOARD_PORT"):
            local_head.up(port=_free_port(), dashboard_port=port)
    assert no_spawn == []


def test_a_port_inside_rays_worker_port_range_is_refused_naming_the_range(no_spawn):
    # Ray's own refusal is a ValueError traceback from `ray start`; raytrain says which flag and what works
    with pytest.raises(ClusterError, match=r"port 15000 \(port\) is inside the range Ray keeps for its worker "
                                           r"processes \(10002-19999\); choose one outside it with --port or "
                                           r"RAYTRAIN_PORT"):
        local_head.up(port=15000, dashboard_port=_free_port())
    with pytest.raises(ClusterError, match=r"port 10002 \(dashboard-port\).*RAYTRAIN_DASHBOARD_PORT"):
        local_head.up(port=_free_port(), dashboard_port=10002)
    assert no_spawn == []


def test_single_node_is_loopback_and_node_ip_keeps_the_network_address(no_spawn):
    with pytest.raises(Spawned):
        local_head.up(port=_free_port(), dashboard_port=_free_port())
    args, kwargs = no_spawn[-1]
    # Ray 2.60 turns --node-ip-address=127.0.0.1 into the machine's address; this setting keeps 127.0.0.1
    assert kwargs["extra_env"] == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    assert not any(a.startswith("--node-ip-address") for a in args)
    with pytest.raises(Spawned):
        local_head.up(port=_free_port(), dashboard_port=_free_port(), node_ip="127.0.0.2")
    args, kwargs = no_spawn[-1]
    assert kwargs["extra_env"] == {} and "--node-ip-address=127.0.0.2" in args


def test_cluster_up_help_says_loopback():
    out = CliRunner().invoke(main, ["cluster", "up", "--help"]).output
    assert "127.0.0.1" in out and "unreachable from other" in out


def test_a_fresh_owner_only_token_at_each_up(no_spawn):
    tokens = []
    for _ in range(2):
        with pytest.raises(Spawned):
            local_head.up(port=_free_port(), dashboard_port=_free_port())
        path = no_spawn[-1][1]["token_path"]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        tokens.append(path.read_text())
    assert tokens[0] != tokens[1] and len(tokens[0]) == 64


def test_the_token_is_not_sent_to_a_listener_that_is_not_our_ray(raytrain_home, tmp_path):
    """Someone else listens on the dashboard port (started after the port check): raytrain stops its own
    `ray start` and sends nothing with the token there."""
    sock, port = _listener()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    token = tmp_path / "tok"
    token.write_text("secret-token")
    cluster = local_head.LocalHeadRecord(
        pid=ours.pid, dashboard_url=f"http://127.0.0.1:{port}", gcs_address="127.0.0.1:1", temp_dir=str(tmp_path),
        token_path=str(token), log_path=str(tmp_path / "log"), started_at=time.time(),
    )
    with sock:
        with pytest.raises(ClusterError, match=f"another process listens on the dashboard port {port}.*did not send"):
            local_head._wait_until_up(cluster, ours, timeout_s=20)
        assert ours.wait(timeout=30) is not None  # our own `ray start` was stopped
        sock.settimeout(0.5)
        received = b""
        try:
            while True:
                conn, _ = sock.accept()
                with conn:
                    conn.settimeout(0.5)
                    try:
                        received += conn.recv(65536)
                    except socket.timeout:
                        pass
        except socket.timeout:
            pass
    assert b"secret-token" not in received and b"Authorization" not in received


def test_owned_by_session_recognises_our_own_listener():
    code = "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        assert ports.owned_by_session(port, proc.pid) is True
        assert ports.owned_by_session(port, os.getsid(0)) is False
        assert ports.owned_by_session(_free_port(), proc.pid) is False  # nobody listens
    finally:
        proc.kill()
        proc.wait()
