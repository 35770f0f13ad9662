"""The training thread of each CPU worker on cores of its own, when the job's workers hold every core of their node.

Unbound, the kernel moves the training threads between the cores (a rank that waits at an all-reduce wakes
up on whichever core is free, its caches left behind) and lets every other process of the node (Ray's head,
the job's supervisor, driver and Train controller, each waking every 10 ms) push it aside on either core.
Bound, each rank's training thread keeps its core, while the process's other threads (gloo's communication
threads, Ray's) still run wherever a core is free. Binding the whole process instead (as DeepSpeed's
launcher does with ``--bind_cores_to_rank``) makes gloo's threads wait for their own rank's training thread,
which costs more than leaving the threads unbound (figures: docs/benchmarks.md, "Code comments' figures").

Threads and processes the training thread starts afterwards (torch's OpenMP threads, data loader workers)
inherit its cores. Binding is safe only where nothing else is entitled to them: here only when the workers on
this node hold all of its CPUs by Ray's count (``local_world_size x CPUs per worker``), that count is every
core the process may run on, and the workers use no GPU (a GPU worker's data loaders and copies want to
roam). On a Kubernetes pod, whose CPU limit is a quota over all the host's cores, the counts differ and
nothing is bound. ``RAYTRAIN_BIND_CORES=0`` (``--env``) never binds.
"""
from __future__ import annotations

import os
import sys

from raytrain import settings

ENV = "RAYTRAIN_BIND_CORES"


def enabled() -> bool:
    return settings.get(ENV)


def cores_for(local_rank: int, local_world_size: int, cpus_per_worker: float, allowed: list[int],
              node_cpus: float | None) -> list[int] | None:
    """The cores local rank ``local_rank`` gets: its own block of ``cpus_per_worker`` of ``allowed`` (sorted),
    or None where the workers do not fill the node exactly (``node_cpus``: the node's CPUs by Ray's count)."""
    per = int(cpus_per_worker) if cpus_per_worker and float(cpus_per_worker).is_integer() else 0
    cores = sorted(allowed)
    if per < 1 or not 0 <= local_rank < local_world_size or local_world_size * per != len(cores):
        return None
    if node_cpus is None or float(node_cpus) != len(cores):
        return None
    return cores[local_rank * per:(local_rank + 1) * per]


def bind_thread(cores: list[int]) -> None:
    """The calling thread on ``cores`` (threads it starts later inherit them; the process's others stay free)."""
    os.sched_setaffinity(0, cores)  # 0: the calling thread, on Linux


def node_cpus() -> float | None:
    """This node's CPUs as Ray counts them."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node.get("Resources", {}).get("CPU")
    return None


def bind_worker(local_rank: int, local_world_size: int, cpus_per_worker: float, use_gpu: bool) -> list[int] | None:
    """On a Ray Train worker's training thread: bind it as :func:`cores_for` says; the cores, or None (nothing
    bound)."""
    if not enabled() or use_gpu or not sys.platform.startswith("linux"):  # (sched_setaffinity: Linux only)
        return None
    try:
        allowed = sorted(os.sched_getaffinity(0))
        if cores_for(local_rank, local_world_size, cpus_per_worker, allowed, len(allowed)) is None:
            return None  # the workers do not fill the cores: no need to ask Ray about the node
        cores = cores_for(local_rank, local_world_size, cpus_per_worker, allowed, node_cpus())
        if cores:
            bind_thread(cores)
        return cores
    except Exception:  # noqa: BLE001 - a restricted sandbox, Ray's state unreachable: run unbound, as before
        return None
