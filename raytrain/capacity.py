"""Does a scaling request fit a cluster? Pure: used by the CLI before submitting and by the driver."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Node:
    node_id: str
    address: str
    resources: dict[str, float]
    alive: bool = True
    hostname: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def worker_slots(nodes: list[Node], per_worker: dict[str, float]) -> int:
    """How many workers of ``per_worker`` resources the cluster can hold at once, node by node."""
    slots = 0
    for node in nodes:
        if not node.alive:
            continue
        fit = math.inf
        for key, need in per_worker.items():
            if need > 0:
                fit = min(fit, math.floor(node.resources.get(key, 0.0) / need + 1e-9))
        slots += 0 if fit is math.inf else int(fit)
    return slots


def capacity_problem(
    num_workers: int, per_worker: dict[str, float], nodes: list[Node], min_workers: int | None = None
) -> str | None:
    """None if the request fits; otherwise one line that names the flags, the capacity and what fits.
    Elastic requests (``min_workers``) fit when the cluster holds at least ``min_workers``."""
    slots = worker_slots(nodes, per_worker)
    elastic = min_workers is not None and min_workers < num_workers
    if slots >= (min_workers if elastic else num_workers):
        return None
    each = " + ".join(f"{v:g} {k}" for k, v in per_worker.items() if v > 0)
    if elastic:
        return (
            f"--workers {min_workers}-{num_workers} x ({each}) needs room for at least {min_workers} worker(s); "
            f"the cluster has room for {slots}: use --workers {max(1, slots)}-{num_workers}"
            + ("" if slots else " after adding capacity")
        )
    alive = [n for n in nodes if n.alive]
    cpus = sum(n.resources.get("CPU", 0.0) for n in alive)
    gpus = sum(n.resources.get("GPU", 0.0) for n in alive)
    need = ", ".join(f"{v * num_workers:g} {k}" for k, v in per_worker.items() if v > 0)
    if slots == 0:
        if per_worker.get("GPU", 0) > 0 and gpus == 0:
            hint = "the cluster has no GPU: use --gpus-per-worker 0 (CPU workers) or a cluster with GPUs"
        else:
            hint = "no node can hold even one worker: lower --cpus-per-worker/--gpus-per-worker"
    else:
        hint = f"use --workers {slots} or fewer, or a bigger cluster"
    return (
        f"--workers {num_workers} x ({each}) needs {need}; the cluster has {cpus:g} CPU and {gpus:g} GPU "
        f"on {len(alive)} node(s), room for {slots} worker(s): {hint}"
    )


def tensor_group_problem(tp: int, per_worker: dict[str, float], nodes: list[Node]) -> str | None:
    """A tensor-parallel group must fit inside one node (its all-reduces run every layer): None if it does."""
    gpus = per_worker.get("GPU", 0.0)
    if tp <= 1 or gpus <= 0:
        return None
    largest = max((n.resources.get("GPU", 0.0) for n in nodes if n.alive), default=0.0)
    need = tp * gpus
    if need <= largest + 1e-9:
        return None
    return (
        f"--tp {tp} x --gpus-per-worker {gpus:g} needs {need:g} GPUs in one node (a tensor-parallel group stays "
        f"inside a node); the largest node has {largest:g}: use --tp {max(1, int(largest // gpus))} or less"
    )
