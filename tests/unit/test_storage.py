"""Refusing node-local storage for multi-node runs (the probe itself runs in the driver on a cluster)."""
from raytrain.storage import storage_problem


def test_node_local_storage_on_two_nodes_is_refused_naming_the_node():
    msg = storage_problem("/data/runs", {"10.0.0.1": True, "10.0.0.2": False})
    assert msg.startswith("--storage /data/runs is node-local: the driver cannot see what node(s) 10.0.0.2 wrote")
    assert "s3://" in msg


def test_shared_storage_single_node_and_uris_pass():
    assert storage_problem("/nfs/runs", {"10.0.0.1": True, "10.0.0.2": True}) is None
    assert storage_problem("/tmp/runs", {"10.0.0.1": True}) is None
    assert storage_problem("s3://bucket/runs", {"10.0.0.1": True, "10.0.0.2": False}) is None
    assert storage_problem(None, {"a": False, "b": False}) is None


def test_a_node_that_cannot_write_is_named_with_its_error():
    msg = storage_problem("/ro/runs", {"10.0.0.1": True, "10.0.0.2": "PermissionError: Permission denied"})
    assert "not every node can write it" in msg and "10.0.0.2: PermissionError" in msg


def test_markers_are_written_for_real(tmp_path):
    from raytrain.storage import write_marker

    assert write_marker(str(tmp_path / "runs"), "m") is None and (tmp_path / "runs" / "m").exists()
    (tmp_path / "file").write_text("")
    assert "Error" in write_marker(str(tmp_path / "file" / "sub"), "m")


def test_a_node_whose_marker_write_hangs_is_named_instead_of_waited_for():
    from raytrain.storage import late_answer

    problem = storage_problem("/mnt/nfs/runs", {"10.0.0.1": True, "10.0.0.2": late_answer("/mnt/nfs/runs")})
    assert problem == ("--storage /mnt/nfs/runs: not every node can write it (10.0.0.2: writing a marker into "
                       "/mnt/nfs/runs did not finish within 60 s (a hung mount?)); use a path every node mounts "
                       "read-write")
