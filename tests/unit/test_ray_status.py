"""`raytrain cluster status`: which jobs' Ray Train workers run on which node, from payloads recorded on a
live Ray 2.60 cluster (head + 1 joined node; tests/unit/data/cluster_status_2nodes.json)."""
import json
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from raytrain.clusters import ray_status
from raytrain.clusters.dashboard import Dashboard

DATA = json.loads((Path(__file__).parent / "data" / "cluster_status_2nodes.json").read_text())
HEAD = "74c4b7b3826b1139eaacb55b2b36a7f3d8de8d8a571f82390b951b9c"
OTHER = "99eea3935c9ef65b885c782f04ca3f5da532d006c2a15b343c53c051"
SPREAD = "raytrain-spread-20261202-225937-b1eb4b"
SOLO = "raytrain-solo-20261202-225938-2d2f52"


def nodes():
    return ray_status.nodes_of(DATA["nodes_summary"]["data"]["summary"])


def test_nodes_carry_id_and_resources():
    head, other = nodes()
    assert (head["node_id"], head["head"], head["cpus"], head["gpus"]) == (HEAD, True, 2.0, 0)
    assert (other["node_id"], other["head"], other["state"]) == (OTHER, False, "ALIVE")
    assert head["memory_total_bytes"] == 25275990016 and head["memory_available_bytes"] == 22335299584


def test_workers_are_placed_on_their_nodes_by_job():
    ns = nodes()
    ray_status.place_workers(ns, ray_status.actors_of(DATA["actors"]), DATA["jobs"])
    head, other = ns
    # strict-spread: one 'spread' worker per node; 'solo' on the second node; the stopped 'cnn' nowhere
    assert head["workers"] == [
        {"job": SPREAD, "name": "spread", "ray_job_id": "03000000", "count": 1, "pids": [19291]}
    ]
    assert other["workers"] == [
        {"job": SOLO, "name": "solo", "ray_job_id": "04000000", "count": 1, "pids": [19503]},
        {"job": SPREAD, "name": "spread", "ray_job_id": "03000000", "count": 1, "pids": [19292]},
    ]
    assert ray_status.workers_cell(other) == f"{SOLO} x1\n{SPREAD} x1"


def test_workers_of_one_job_on_one_node_are_counted():
    actors = ray_status.actors_of(DATA["actors"])
    packed = [dict(a, node_id=HEAD) for a in actors if a["job_id"] == "03000000"]
    ns = nodes()
    ray_status.place_workers(ns, packed, DATA["jobs"])
    assert [(w["job"], w["count"], w["pids"]) for w in ns[0]["workers"]] == [(SPREAD, 2, [19291, 19292])]
    assert ns[1]["workers"] == [] and ray_status.workers_cell(ns[1]) == "-"


def test_a_job_raytrain_did_not_submit_keeps_its_own_id_and_no_name():
    jobs = [dict(j, metadata={}) if j["job_id"] == "04000000" else j for j in DATA["jobs"]]
    jobs = [j for j in jobs if j["job_id"] != "03000000"]  # and one Ray does not list at all
    ns = nodes()
    ray_status.place_workers(ns, ray_status.actors_of(DATA["actors"]), jobs)
    assert [(w["job"], w["name"]) for w in ns[1]["workers"]] == [("03000000", ""), (SOLO, "")]


def test_no_workers_when_no_job_runs():
    ns = nodes()
    ray_status.place_workers(ns, ray_status.actors_of(DATA["actors_none"]), DATA["jobs"])
    assert [n["workers"] for n in ns] == [[], []]


def test_a_state_api_error_answer_is_refused():
    with pytest.raises(ValueError, match="state API"):
        ray_status.actors_of({"result": False, "msg": "Failed to query actors", "data": {}})
    with pytest.raises(ValueError):
        ray_status.actors_of([])


def test_the_query_filters_alive_ray_train_workers():
    query = parse_qsl(urlsplit(ray_status.WORKERS_PATH).query)
    assert urlsplit(ray_status.WORKERS_PATH).path == "/api/v0/actors"
    keys = [v for k, v in query if k == "filter_keys"]
    values = [v for k, v in query if k == "filter_values"]
    assert dict(zip(keys, values)) == {"class_name": "RayTrainWorker", "state": "ALIVE"}
    assert [v for k, v in query if k == "filter_predicates"] == ["=", "="]


def test_an_unreachable_state_api_leaves_the_nodes_and_says_why():
    # a real HTTP client against a port nothing listens on
    ns = nodes()
    error = ray_status.add_worker_placement(Dashboard("http://127.0.0.1:9"), ns)
    assert error and "cannot reach the Ray cluster" in error
    assert [n["workers"] for n in ns] == [None, None] and ray_status.workers_cell(ns[0]) == "?"
    assert ns[0]["cpus"] == 2.0
