"""The two-node fixture itself: two ALIVE nodes on their own addresses, tasks placed by custom resource,
node-local storage that really differs between the nodes, a shared folder that does not."""
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = pytest.mark.multinode


def test_two_nodes_alive_on_their_own_addresses(two_nodes):
    nodes = two_nodes.nodes()
    alive = {n["ip"]: n for n in nodes if n["state"] == "ALIVE"}
    assert set(alive) == {"10.213.0.1", "10.213.0.2"}, nodes
    assert alive["10.213.0.1"]["head"] and not alive["10.213.0.2"]["head"]
    assert all(n["cpus"] == 1 for n in alive.values())
    assert two_nodes.node2_alive() and two_nodes.node2_pids()


def test_task_pinned_to_node2_runs_there_with_its_own_local_disk(two_nodes):
    (two_nodes.node_local_dir / "from-head.txt").write_text("head")
    (two_nodes.shared_dir / "shared.txt").write_text("both")
    out = two_nodes.run_ray(
        f"""
import os
@ray.remote(resources={{"node_2": 1}})
def where(local, shared):
    open(os.path.join(local, "from-node2.txt"), "w").write("node2")
    return {{
        "ip": ray.util.get_node_ip_address(),
        "local": sorted(os.listdir(local)),
        "shared": open(os.path.join(shared, "shared.txt")).read(),
    }}
print(json.dumps(ray.get(where.remote({str(two_nodes.node_local_dir)!r}, {str(two_nodes.shared_dir)!r}))))
"""
    )
    assert out["ip"] == "10.213.0.2"
    assert out["local"] == ["from-node2.txt"]  # not the head's file: node 2's own tmpfs
    assert out["shared"] == "both"
    on_head = {p.name for p in two_nodes.node_local_dir.iterdir()}
    assert "from-head.txt" in on_head and "from-node2.txt" not in on_head  # node 2 wrote only its own disk


def test_join_with_a_wrong_token_fails_clearly(two_nodes, tmp_path):
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    temp_dir = tempfile.mkdtemp(prefix="rt-mnw-", dir="/tmp")  # short: Ray's socket paths
    env = {**two_nodes.node2_cli.env, "RAYTRAIN_HOME": str(tmp_path / "home"), "RAYTRAIN_RAY_TEMP_DIR": temp_dir}
    cmd = [
        "ip", "netns", "exec", two_nodes.netns, sys.executable, "-m", "raytrain.cli.main", "cluster", "join",
        two_nodes.gcs_address, "--token-file", str(wrong), "--node-ip", two_nodes.node2_ip, "--timeout", "50",
    ]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr
    assert "the head refused the token" in proc.stderr
    assert time.monotonic() - t0 < 60


def test_kill_node2_then_start_node2(two_nodes):
    """The fixture's failure tools: SIGKILL node 2 (the head marks it DEAD), rejoin it with a fresh local disk."""
    (two_nodes.node_local_dir / "from-head.txt").write_text("head")
    two_nodes.kill_node2()
    assert not two_nodes.node2_alive()
    t0 = time.monotonic()
    two_nodes.wait_alive({two_nodes.head_ip})
    print(f"head saw node 2 dead after {time.monotonic() - t0:.1f} s")
    two_nodes.start_node2()
    assert two_nodes.node2_alive()
    out = two_nodes.run_ray(
        f"""
import os
@ray.remote(resources={{"node_2": 1}})
def ls(local):
    return {{"ip": ray.util.get_node_ip_address(), "local": os.listdir(local)}}
print(json.dumps(ray.get(ls.remote({str(two_nodes.node_local_dir)!r}))))
"""
    )
    assert out == {"ip": "10.213.0.2", "local": []}
