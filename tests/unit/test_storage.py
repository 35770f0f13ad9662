"""Refusing node-local storage for multi-node runs (the probe itself runs in the driver on a cluster)."""
from raytrain.storage import storage_problem


def test_node_local_storage_on_two_nodes_is_refused_naming_the_node():
    msg = storage_problem("/data/runs", {"10.0.0.1": True, "10.0.0.2": False})
    assert msg.startswith("--storage /data/runs is node-local: node(s) 10.0.0.2 cannot see it")
    assert "s3://" in msg


def test_shared_storage_single_node_and_uris_pass():
    assert storage_problem("/nfs/runs", {"10.0.0.1": True, "10.0.0.2": True}) is None
    assert storage_problem("/tmp/runs", {"10.0.0.1": True}) is None
    assert storage_problem("s3://bucket/runs", {"10.0.0.1": True, "10.0.0.2": False}) is None
    assert storage_problem(None, {"a": False, "b": False}) is None
