"""Is the run's storage shared by every node? Multi-node training with node-local storage loses shards."""
from __future__ import annotations

PROBE_TIMEOUT_S = 60.0  # how long the driver waits for every node to write its marker


def is_uri(storage: str) -> bool:
    return "://" in storage


def storage_problem(storage: str | None, visibility: dict[str, bool | str]) -> str | None:
    """``visibility``: node address -> True if the driver read back the marker that node wrote, False if it
    did not, or the error the node got writing it. None if the storage is fine."""
    if not storage or is_uri(storage) or len(visibility) <= 1:
        return None
    errors = {node: v for node, v in sorted(visibility.items()) if isinstance(v, str)}
    blind = sorted(node for node, v in visibility.items() if v is False)
    if errors:
        detail = "; ".join(f"{node}: {err}" for node, err in errors.items())
        return f"--storage {storage}: not every node can write it ({detail}); use a path every node mounts read-write"
    if not blind:
        return None
    return (
        f"--storage {storage} is node-local: the driver cannot see what node(s) {', '.join(blind)} wrote there, "
        "so their checkpoint shards would be lost; use a path every node mounts (NFS, a ReadWriteMany PVC on "
        "KubeRay) or a cloud URI such as s3://bucket/runs"
    )


def write_marker(storage: str, name: str) -> str | None:
    """Runs on each node: write ``storage``/``name``; None, or the error."""
    import os

    try:
        os.makedirs(storage, exist_ok=True)
        with open(os.path.join(storage, name), "w") as f:
            f.write("raytrain storage check\n")
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def late_answer(storage: str) -> str:
    """What a node whose marker write did not return in time reports (a hung network mount, a busy node)."""
    return f"writing a marker into {storage} did not finish within {PROBE_TIMEOUT_S:g} s (a hung mount?)"


def probe_visibility(storage: str, marker_prefix: str) -> dict[str, bool | str]:
    """A task on every alive node writes a marker into ``storage``; the driver reads each one back."""
    import os

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return {n.get("NodeManagerAddress", "?"): True for n in nodes}
    names = [f"{marker_prefix}-{n['NodeID'][:12]}" for n in nodes]
    write = ray.remote(num_cpus=0)(write_marker)
    refs = [
        write.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(storage, name)
        for n, name in zip(nodes, names)
    ]
    _, late = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    errors = [late_answer(storage) if ref in late else ray.get(ref) for ref in refs]
    result: dict[str, bool | str] = {}
    for n, name, error in zip(nodes, names, errors):
        path = os.path.join(storage, name)
        result[n.get("NodeManagerAddress", "?")] = error or os.path.exists(path)
        if error is None and os.path.exists(path):
            os.remove(path)
    return result


def local_storage_problem(storage: str | None) -> str | None:
    """Where the run's storage is on this machine (the local cluster): can this user create and write it?
    None if so (or for a URI), else why not and what would work. Leaves nothing behind: a probe folder in
    the nearest existing ancestor is made and removed at once."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(storage or "").expanduser()
    if not storage or is_uri(storage) or not path.is_absolute():
        return None
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"--storage {storage}: {existing} is a file, not a folder; give a folder you can write"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".raytrain-storage-check-", dir=existing))
    except OSError as exc:
        return (
            f"--storage {storage}: cannot write to {existing} ({exc.strerror or type(exc).__name__}); "
            "give a folder you can write (default: ~/.raytrain/runs)"
        )
    return None
