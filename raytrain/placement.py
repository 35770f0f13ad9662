"""Placement groups as Ray's state API lists them: what a job holds, what a waiting job waits for and who holds
it, and which groups ended jobs left behind. Pure functions over the state API's dicts (the dashboard's
``/api/v0/placement_groups?detail=1`` and ``ray.util.state.list_placement_groups(detail=True)`` give the same
fields), shared by the driver (raytrain.runtime) and `jobs stop`."""
from __future__ import annotations

from typing import Iterable

WAITING_STATES = ("PENDING", "RESCHEDULING")
ALIVE_JOB_STATES = ("PENDING", "RUNNING")


def live(groups: Iterable[dict]) -> list[dict]:
    return [g for g in groups if str(g.get("state", "")).upper() != "REMOVED"]


def of_job(groups: Iterable[dict], ray_job_id: str) -> list[dict]:
    """The live groups a job created (Ray's job id, e.g. ``03000000``, not the submission id)."""
    return [g for g in live(groups) if g.get("creator_job_id") == ray_job_id]


def waiting(groups: Iterable[dict]) -> list[dict]:
    return [g for g in live(groups) if str(g.get("state", "")).upper() in WAITING_STATES]


def placed(groups: Iterable[dict]) -> list[dict]:
    return [g for g in live(groups) if str(g.get("state", "")).upper() == "CREATED"]


def leaked(groups: Iterable[dict], alive_job_ids: Iterable[str]) -> list[dict]:
    """Live groups whose creator job has ended. Ray removes a job's groups when it ends, except (a Ray 2.60 bug)
    a job stopped while its workers start; detached groups outlive their job on purpose and are left alone."""
    alive = set(alive_job_ids)
    return [g for g in live(groups) if not g.get("is_detached") and g.get("creator_job_id") not in alive]


def alive_job_ids(jobs: Iterable[dict]) -> list[str]:
    """Ray job ids of jobs whose driver may still run (Jobs API details: ``job_id``, ``status``)."""
    return [j["job_id"] for j in jobs if j.get("job_id") and str(j.get("status", "")).split(".")[-1].upper()
            in ALIVE_JOB_STATES]


def demand(group: dict) -> dict[str, float]:
    """The resources a group's bundles ask for, summed."""
    total: dict[str, float] = {}
    for bundle in group.get("bundles") or []:
        for name, amount in (bundle.get("unit_resources") or {}).items():
            total[name] = total.get(name, 0.0) + float(amount)
    return total


def format_resources(resources: dict[str, float]) -> str:
    """``{"CPU": 2.0, "GPU": 1.0}`` -> "2 CPU, 1 GPU" (memory and Ray's internal resources left out)."""
    shown = [(k, v) for k, v in resources.items() if v and k not in ("memory", "object_store_memory")
             and not k.startswith("node:") and "_group_" not in k]
    order = {"CPU": 1, "GPU": 0}
    shown.sort(key=lambda kv: (order.get(kv[0], 2), kv[0]))
    return ", ".join(f"{v:g} {k}" for k, v in shown) or "nothing"


def waiting_message(mine: list[dict], groups: Iterable[dict], job_names: dict[str, str]) -> str:
    """What a job whose groups ``mine`` cannot be placed waits for, and who holds it:
    "waiting for 2 CPU; 2 CPU held by job raytrain-a-..." (``job_names``: Ray job id -> submission id)."""
    wanted: dict[str, float] = {}
    for group in waiting(mine):
        for name, amount in demand(group).items():
            wanted[name] = wanted.get(name, 0.0) + amount
    own = {g.get("placement_group_id") for g in mine}
    holders: dict[str, dict[str, float]] = {}
    for group in placed(groups):
        if group.get("placement_group_id") in own:
            continue
        held = {k: v for k, v in demand(group).items() if k in wanted}
        if not held:
            continue
        job = group.get("creator_job_id") or "?"
        name = job_names.get(job) or f"(Ray job {job})"
        for k, v in held.items():
            holders.setdefault(name, {})[k] = holders.setdefault(name, {}).get(k, 0.0) + v
    text = f"waiting for {format_resources(wanted)}"
    if not holders:
        return text + "; no other job holds them (the cluster's nodes are busy or too small)"
    return text + "; " + ", ".join(f"{format_resources(r)} held by job {n}" for n, r in holders.items())
