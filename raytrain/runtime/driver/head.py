"""Where the driver and the job's own actors run: the head node, never a worker node that may be lost.

The driver (this Ray job's entrypoint) holds Ray Train's controller, which Ray Train pins to the driver's
node; raytrain's actors (each ``--data`` dataset's Feeder, the job's board) are pinned there too. A lost
worker node then costs only the workers on it (``--max-failures``, ``--workers MIN-MAX`` restart them);
the head's loss ends the cluster anyway.

Ray puts a Jobs API entrypoint on the head node when the submission asks for no entrypoint resources
(raytrain asks for none), unless the cluster sets ``RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES=1``: the driver
checks where it landed (``driver_node_problem``) and, elsewhere, warns in the job's log naming both nodes
(the cluster owner's choice: the job goes on).

The actors ask for no CPU, and Ray places an actor that asks for no resources on a *random* node unless
its strategy is a hard node affinity (a soft one is ignored for it): so the pin is ``soft=False``. If that
node cannot take the actor, its creation fails (the caller reports it) instead of moving it elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATE_API_TIMEOUT_S = 20  # one list_nodes call to the dashboard


@dataclass(frozen=True)
class NodeSeen:
    node_id: str
    ip: str
    is_head: bool
    alive: bool


def head_of(nodes: list[NodeSeen]) -> NodeSeen | None:
    """The cluster's live head node (None: none is listed alive)."""
    return next((n for n in nodes if n.is_head and n.alive), None)


def driver_node_problem(driver_id: str, nodes: list[NodeSeen]) -> str | None:
    """What running where it does risks (None: the driver runs on the head, or the head is not known)."""
    head = head_of(nodes)
    if head is None or head.node_id == driver_id:
        return None
    here = next((n for n in nodes if n.node_id == driver_id), None)
    where = f"{here.ip} (node {driver_id[:12]})" if here else f"node {driver_id[:12]}"
    return (f"the job's driver runs on the worker node {where}, not on the head node {head.ip} "
            f"(node {head.node_id[:12]}): losing that node ends the job and its data feed (continue with "
            f"--resume) instead of restarting its workers; Ray places a job's entrypoint off the head only when "
            f"the head's Ray runs with RAY_JOB_ALLOW_DRIVER_ON_WORKER_NODES=1 (raytrain asks for no entrypoint "
            f"resources)")


def list_nodes(timeout_s: float = STATE_API_TIMEOUT_S) -> list[NodeSeen]:
    """The cluster's nodes as Ray's state API lists them (raises when it does not answer)."""
    import os

    from ray.util.state import list_nodes as ray_list_nodes

    # the job's cluster by its address: Ray's "auto" fails on a machine running two Ray clusters
    nodes = ray_list_nodes(address=os.environ.get("RAY_ADDRESS") or None, limit=10_000, timeout=int(timeout_s),
                           raise_on_missing_output=False)
    return [NodeSeen(n.node_id, n.node_ip, bool(n.is_head_node), str(n.state) == "ALIVE") for n in nodes]


def this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def pinned(node_id: str) -> Any:
    """A scheduling strategy that places an actor on ``node_id`` or fails: never a silent move."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def pinned_here() -> Any:
    return pinned(this_node())
