"""`raytrain cluster status`: nodes, and which jobs' Ray Train workers run on each (pure logic, no I/O).

The inputs are the dashboard's own payloads, so the CLI only fetches and prints:

- ``GET /nodes?view=summary``: per node ``hostname``, ``ip``, ``cpu`` (percent), ``mem`` ([total, available,
  ...]) and ``raylet`` (``nodeId``, ``isHeadNode``, ``state``, ``resourcesTotal``);
- ``GET /api/v0/actors`` (Ray's state API) filtered to ``class_name=RayTrainWorker`` (Ray Train v2's worker
  actor), ``state=ALIVE``: per actor ``node_id``, ``job_id`` (Ray's hex job id), ``pid``;
- ``GET /api/jobs/``: per job ``job_id`` (the same hex id), ``submission_id`` (raytrain's job id) and
  ``metadata`` (raytrain's ``name``).

Ray Train does not expose a worker's rank through the state API (its actors are unnamed), so a node
lists each job's worker count and process ids.
"""
from __future__ import annotations

from urllib.parse import urlencode

from raytrain.clusters.dashboard import METADATA_KEY

WORKER_CLASS = "RayTrainWorker"
JOBS_PATH = "/api/jobs/"
WORKERS_PATH = "/api/v0/actors?" + urlencode(
    [
        ("filter_keys", "class_name"), ("filter_predicates", "="), ("filter_values", WORKER_CLASS),
        ("filter_keys", "state"), ("filter_predicates", "="), ("filter_values", "ALIVE"),
        ("limit", "10000"),
    ]
)


def nodes_of(summaries: list[dict]) -> list[dict]:
    """The per-node part of the report from the entries of ``GET /nodes?view=summary``."""
    nodes = []
    for entry in summaries:
        raylet = entry.get("raylet") or {}
        res = raylet.get("resourcesTotal") or {}
        mem = entry.get("mem") or [0, 0]
        nodes.append(
            {
                "node_id": raylet.get("nodeId", ""),
                "hostname": entry.get("hostname"),
                "ip": entry.get("ip"),
                "head": bool(raylet.get("isHeadNode")),
                "state": (raylet.get("state") or "ALIVE"),
                "cpus": res.get("CPU", 0),
                "gpus": res.get("GPU", 0),
                "memory_total_bytes": mem[0] if mem else 0,
                "memory_available_bytes": mem[1] if len(mem) > 1 else 0,
                "cpu_percent": entry.get("cpu"),
            }
        )
    return nodes


def actors_of(actors_payload: dict) -> list[dict]:
    """The actor list of a state API answer; ValueError if the answer is not one."""
    if not isinstance(actors_payload, dict) or actors_payload.get("result") is False:
        msg = actors_payload.get("msg") if isinstance(actors_payload, dict) else None
        raise ValueError(f"the state API answered with an error: {msg or actors_payload!r}"[:300])
    result = ((actors_payload.get("data") or {}).get("result")) or {}
    actors = result.get("result")
    if not isinstance(actors, list):
        raise ValueError("the state API answer has no actor list")
    return actors


def place_workers(nodes: list[dict], actors: list[dict], jobs: list[dict]) -> None:
    """Set ``node["workers"]`` on every node: ``[{"job", "name", "ray_job_id", "count", "pids"}]``, one
    entry per job with live Ray Train workers there (raytrain's submission id as ``job``; a job that
    raytrain did not submit keeps its own submission id, or Ray's job id, and an empty name)."""
    by_ray_id = {j.get("job_id"): j for j in jobs if j.get("job_id")}
    index = {n["node_id"]: n for n in nodes}
    for n in nodes:
        n["workers"] = []
    for actor in actors:
        if actor.get("class_name", WORKER_CLASS) != WORKER_CLASS or actor.get("state", "ALIVE") != "ALIVE":
            continue
        node = index.get(actor.get("node_id"))
        if node is None:
            continue
        ray_job_id = actor.get("job_id") or ""
        job = by_ray_id.get(ray_job_id) or {}
        meta = job.get("metadata") or {}
        job_key = job.get("submission_id") or ray_job_id
        entry = next((w for w in node["workers"] if w["job"] == job_key), None)
        if entry is None:
            entry = {
                "job": job_key,
                "name": meta.get("name", "") if METADATA_KEY in meta else "",
                "ray_job_id": ray_job_id,
                "count": 0,
                "pids": [],
            }
            node["workers"].append(entry)
        entry["count"] += 1
        if actor.get("pid"):
            entry["pids"].append(actor["pid"])
    for n in nodes:
        for w in n["workers"]:
            w["pids"].sort()
        n["workers"].sort(key=lambda w: w["job"])


def mark_unavailable(nodes: list[dict]) -> None:
    """Worker placement could not be read: ``workers`` is None (unknown), not [] (none)."""
    for n in nodes:
        n["workers"] = None


def workers_cell(node: dict) -> str:
    """The table cell: one ``JOB xN`` line per job, ``-`` for none, ``?`` when unknown."""
    workers = node.get("workers")
    if workers is None:
        return "?"
    if not workers:
        return "-"
    return "\n".join(f"{w['job']} x{w['count']}" for w in workers)


def add_worker_placement(dashboard, nodes: list[dict]) -> str | None:
    """Fetch the live Ray Train workers and the job list from ``dashboard`` and place them on ``nodes``.
    Never raises: on any failure the nodes get ``workers = None`` and the reason is returned."""
    try:
        actors = actors_of(dashboard.get(WORKERS_PATH))
        jobs = dashboard.get(JOBS_PATH)
        if not isinstance(jobs, list):
            raise ValueError(f"{JOBS_PATH} did not answer with a job list")
        place_workers(nodes, actors, jobs)
        return None
    except Exception as exc:  # a status display must not fail because one API did
        mark_unavailable(nodes)
        return str(exc) or type(exc).__name__
