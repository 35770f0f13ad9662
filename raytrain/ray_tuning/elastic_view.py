"""An elastic run sizes each start and restart by the cluster's nodes now (the ``elastic_fresh_view`` tuning).

Ray Train's elastic policy takes a group's size from what Ray's AutoscalingCoordinator (a detached actor
shared by Ray Train and Ray Data) reserves for the run. The coordinator reads the cluster's nodes only on its
20 s tick, so for up to 20 s after a node joins it reserves as if the node were not there: an elastic job
submitted then started on fewer workers than the cluster had (then grew, with a restart, after Ray Train's
60 s resize interval), and one that restarted then, after a lost node, was sized as if the node still ran.

Ray's coordinator offers the fix itself, ``get_reserved_resources(..., recompute=True)`` ("callers that turn
the answer into node pins want this"), but Ray Train never asks for it. Here the policy asks for it before
each start or restart decision (at most every 5 s while a group waits to start); a running group's periodic
resize check keeps Ray's cheaper poll. Overrides a private method's caller of Ray Train's
``ElasticScalingPolicy`` and sets its cached reservation (``_latest_reserved_resources``).
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_FRESH: list[type] = []


# A refresh is a full tick of the coordinator (it also re-sends the cluster's requests to the autoscaler): at
# most this often while a group waits to start; the policy's 1 s polls in between read the last reservation
REFRESH_INTERVAL_S = 5.0


def refresh(policy: Any) -> None:
    """Have the coordinator re-read the nodes and re-reserve, and keep its answer as the policy's latest (the
    base class then uses it instead of asking again). On an error the base class asks as it always does."""
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


def fresh_view(policy: Any) -> Any:
    """Ray Train's elastic policy, asking the coordinator for a fresh view before it starts or restarts a group;
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
                return super().make_decision_for_non_running_worker_group()

        _FRESH.append(ElasticScalingPolicyWithFreshView)
    return _FRESH[0](policy.scaling_config)
