"""Is the run's storage shared by every node? Multi-node training with node-local storage loses shards."""
from __future__ import annotations


def is_uri(storage: str) -> bool:
    return "://" in storage


def storage_problem(storage: str | None, visibility: dict[str, bool]) -> str | None:
    """``visibility``: node address -> whether that node sees the marker the driver wrote. None if fine."""
    if not storage or is_uri(storage) or len(visibility) <= 1:
        return None
    blind = sorted(node for node, sees in visibility.items() if not sees)
    if not blind:
        return None
    return (
        f"--storage {storage} is node-local: node(s) {', '.join(blind)} cannot see it, so their checkpoint "
        "shards would be lost; use a path every node mounts (NFS, a ReadWriteMany PVC on KubeRay) or a cloud "
        "URI such as s3://bucket/runs"
    )


def probe_visibility(storage: str, marker_name: str) -> dict[str, bool]:
    """Write a marker into ``storage`` from the driver and ask a task on every alive node whether it sees it."""
    import os

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return {n.get("NodeManagerAddress", "?"): True for n in nodes}
    os.makedirs(storage, exist_ok=True)
    marker = os.path.join(storage, marker_name)
    with open(marker, "w") as f:
        f.write("raytrain storage check\n")
    try:
        sees = ray.remote(num_cpus=0)(os.path.exists)
        refs = [
            sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(marker)
            for n in nodes
        ]
        return {n.get("NodeManagerAddress", "?"): bool(r) for n, r in zip(nodes, ray.get(refs, timeout=60))}
    finally:
        os.remove(marker)
