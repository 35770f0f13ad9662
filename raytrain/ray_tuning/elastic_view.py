"""An elastic run sizes each start and restart by the cluster's nodes now (the ``elastic_fresh_view`` tuning).

Ray Train's elastic policy takes a group's size from what Ray's AutoscalingCoordinator (a detached actor
shared by Ray Train and Ray Data) reserves for the run. Two ways that view lags the cluster:
- The coordinator reads the nodes only on its 20 s tick: for up to 20 s after a node joins it reserves as if
  the node were not there, so an elastic job submitted then started on fewer workers than the cluster had
  (and grew, with a restart, after Ray Train's 60 s resize interval). Ray's coordinator offers the fix itself,
  ``get_reserved_resources(..., recompute=True)`` ("callers that turn the answer into node pins want this"),
  which Ray Train never asks for: the policy asks for it before each start or restart decision (at most every
  5 s while a group waits to start).
- After a node is lost, Ray's health checks take 15-20 s to mark it dead, and Ray Train decides the new group
  at once: it counted the lost node, asked for a group that could not be placed, and waited its 60 s worker
  group start timeout before deciding again. So at a start or restart the policy also knocks at each node's
  raylet (a TCP connect, 1 s at most, in parallel): a node that does not answer is not counted. A node that
  answers again later is counted by Ray Train's own resize check.
A running group's periodic resize check keeps Ray's cheaper poll. Overrides methods of Ray Train's
``ElasticScalingPolicy`` and sets its cached reservation (``_latest_reserved_resources``).
"""
from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

_FRESH: list[type] = []

# A refresh is a full tick of the coordinator (it also re-sends the cluster's requests to the autoscaler): at
# most this often while a group waits to start; the policy's 1 s polls in between read the last reservation
REFRESH_INTERVAL_S = 5.0
KNOCK_TIMEOUT_S = 1.0  # a raylet on a live node accepts a connection in milliseconds


def refresh(policy: Any) -> None:
    """Have the coordinator re-read the nodes and re-reserve, and keep its answer as the policy's latest (the
    base class then uses it instead of asking again); note which reserved nodes do not answer. On an error the
    base class asks as it always does."""
    import ray
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
    )
    from ray.train.v2._internal.util import time_monotonic

    now = time_monotonic()
    if (now - getattr(policy, "_raytrain_refreshed_at", float("-inf")) < REFRESH_INTERVAL_S
            or now - policy._latest_reserved_resources_query_time < policy.GET_RESERVED_RESOURCES_INTERVAL_S):
        return
    policy._raytrain_refreshed_at = now
    try:
        reserved = ray.get(policy._autoscaling_coordinator.get_reserved_resources.remote(
            policy._requester_id, recompute=True), timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the stock path (a 20 s old view) still decides
        logger.debug("raytrain: could not refresh the autoscaling coordinator's view: %s", exc)
        return
    policy._latest_reserved_resources = reserved
    policy._latest_reserved_resources_query_time = time_monotonic()
    policy._raytrain_silent = silent_nodes(reserved or {}, ray.nodes)


def knock(address: str, port: int, timeout_s: float = KNOCK_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at ``address:port`` within ``timeout_s``."""
    try:
        socket.create_connection((address, int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


def silent_nodes(node_ids: Iterable[str], nodes: Callable[[], list[dict]],
                 answers: Callable[[str, int], bool] = knock) -> set[str]:
    """Of ``node_ids``, those Ray no longer lists as alive or whose raylet does not take a connection."""
    ids = list(node_ids)
    if not ids:
        return set()
    try:
        known = {n.get("NodeID"): n for n in nodes()}
    except Exception as exc:  # noqa: BLE001 - cannot tell: count every node, as Ray Train does
        logger.debug("raytrain: could not list the nodes: %s", exc)
        return set()

    def alive(node_id: str) -> bool:
        node = known.get(node_id)
        if node is None or not node.get("Alive"):
            return False
        address, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
        return not address or not port or answers(address, port)  # nothing to knock at: trust Ray's view

    with ThreadPoolExecutor(max_workers=min(16, len(ids))) as pool:
        silent = {node_id for node_id, ok in zip(ids, pool.map(alive, ids)) if not ok}
    if silent:
        logger.info("raytrain: not counting %d node(s) whose raylet does not answer: %s", len(silent),
                    ", ".join(sorted(silent)))
    return silent


def fresh_view(policy: Any) -> Any:
    """Ray Train's elastic policy, deciding each start or restart from a fresh view of the nodes that answer;
    any other policy unchanged."""
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

    if type(policy) is not ElasticScalingPolicy:
        return policy
    if not _FRESH:
        class ElasticScalingPolicyWithFreshView(ElasticScalingPolicy):
            def make_decision_for_non_running_worker_group(self):
                # The run's request first: the coordinator reserves only for requests it has
                self._maybe_send_resource_request()
                refresh(self)
                self._raytrain_starting = True
                try:
                    return super().make_decision_for_non_running_worker_group()
                finally:
                    self._raytrain_starting = False

            def _count_possible_workers(self, reserved_resources):
                silent = getattr(self, "_raytrain_silent", ()) if getattr(self, "_raytrain_starting", False) else ()
                if silent:
                    reserved_resources = {n: r for n, r in reserved_resources.items() if n not in silent}
                return super()._count_possible_workers(reserved_resources)

        _FRESH.append(ElasticScalingPolicyWithFreshView)
    return _FRESH[0](policy.scaling_config)
