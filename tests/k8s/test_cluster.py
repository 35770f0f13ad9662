"""`raytrain cluster up|status|down --k8s` against a real API server: RayClusters from profiles."""
import json

import yaml

from raytrain.clusters.profiles import load_cluster_profile
from raytrain.clusters.k8s_manifests import render_raycluster
from tests.conftest import ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"


def test_cluster_up_creates_a_raycluster_matching_the_profile(cli, namespace, rayclusters, stored):
    r = cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace)
    assert r.exit_code == 0, r.output
    assert f"RayCluster {namespace}/raytrain created" in r.output

    obj = rayclusters.get("raytrain")
    profile = load_cluster_profile(EXAMPLE)
    assert obj["spec"] == stored(render_raycluster(profile, "raytrain", namespace))
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "raytrain"
    assert obj["metadata"]["annotations"]["raytrain.io/storage"] == "/mnt/checkpoints"

    head = obj["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"]["num-cpus"] == "0"  # a CPU head that runs no training worker
    assert head["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    group = obj["spec"]["workerGroupSpecs"][0]
    assert group["groupName"] == "gpu-workers" and group["replicas"] == 2
    pod = group["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    pvc = next(v for v in pod["volumes"] if v["name"] == "raytrain-storage")
    assert pvc["persistentVolumeClaim"] == {"claimName": "raytrain-checkpoints"}


def test_cluster_up_twice_is_idempotent_and_a_changed_profile_updates(cli, namespace, rayclusters, tmp_path):
    args = ("cluster", "up", "--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "twice")
    assert cli(*args).exit_code == 0
    first = rayclusters.get("twice")
    r = cli(*args)
    assert r.exit_code == 0 and "unchanged" in r.output, r.output
    again = rayclusters.get("twice")
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert again["metadata"]["generation"] == 1

    data = yaml.safe_load(EXAMPLE.read_text())
    data["workers"]["replicas"] = 3
    changed = tmp_path / "bigger.yaml"
    changed.write_text(yaml.safe_dump(data))
    r = cli("cluster", "up", "--profile", changed, "--namespace", namespace, "--name", "twice")
    assert r.exit_code == 0 and "updated" in r.output, r.output
    updated = rayclusters.get("twice")
    assert updated["spec"]["workerGroupSpecs"][0]["replicas"] == 3 and updated["metadata"]["generation"] == 2


def test_dry_run_prints_what_up_applies_and_applies_nothing(cli, namespace, rayclusters, stored):
    r = cli("cluster", "up", "--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "dry", "--dry-run")
    assert r.exit_code == 0, r.output
    printed = next(yaml.safe_load_all(r.output))
    assert rayclusters.get("dry") is None
    assert cli("cluster", "up", "--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "dry").exit_code == 0
    obj = rayclusters.get("dry")
    assert obj["spec"] == stored(printed)
    assert {k: obj["metadata"][k] for k in printed["metadata"]} == printed["metadata"]


def test_status_reads_the_raycluster_and_down_deletes_it(cli, namespace, rayclusters):
    base = ("--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "life")
    assert cli("cluster", "up", *base).exit_code == 0
    report = json.loads(cli("cluster", "status", *base, "--json").output)
    assert report["exists"] and report["state"] == "pending"
    assert report["head_service"] == "life-head-svc" and report["dashboard_port"] == 8265
    assert report["totals"] == {"cpus": 128, "gpus": 16}  # 2 pods x (64 CPU, 8 GPU); the head offers 0 CPU

    # the operator reports the cluster ready
    rayclusters.merge_patch(
        "life", {"status": {"state": "ready", "desiredWorkerReplicas": 2, "availableWorkerReplicas": 2}}, status=True
    )
    text = cli("cluster", "status", *base).output
    assert f"RayCluster {namespace}/life: ready" in text and "2/2 available" in text

    r = cli("cluster", "down", *base)
    assert r.exit_code == 0 and f"RayCluster {namespace}/life deleted" in r.output
    assert rayclusters.get("life") is None
    assert "no RayCluster 'life'" in cli("cluster", "down", *base).output
    assert json.loads(cli("cluster", "status", *base, "--json").output)["exists"] is False


def test_invalid_cluster_name_is_refused_before_anything_is_created(cli, namespace, rayclusters):
    r = cli("cluster", "up", "--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "Bad_Name")
    assert r.exit_code == 2
    assert "--name 'Bad_Name': invalid RayCluster name" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert rayclusters.list() == []


def test_the_shipped_manifests_pass_the_servers_schema(kube, namespace, stored):
    """k8s/raycluster.yaml and k8s/rayjob.yaml, applied as a user would (namespace changed to the test's)."""
    from raytrain.clusters.k8s_client import RayObjects

    for path, plural in ((ROOT / "k8s" / "raycluster.yaml", "rayclusters"), (ROOT / "k8s" / "rayjob.yaml", "rayjobs")):
        docs = list(yaml.safe_load_all(path.read_text()))
        assert [d["kind"] for d in docs[1:]] == ["NetworkPolicy"]  # the loopback server serves no core API
        doc = docs[0]
        doc["metadata"]["namespace"] = namespace
        obj = RayObjects(kube, plural, namespace).apply(doc)
        assert obj["spec"] == stored(doc)


def test_a_raycluster_raytrain_did_not_make_is_never_taken_over_or_deleted(cli, namespace, rayclusters):
    theirs = render_raycluster(load_cluster_profile(EXAMPLE), "theirs", namespace)
    del theirs["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    rayclusters.apply(theirs)
    before = rayclusters.get("theirs")
    base = ("--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "theirs")
    for command in ("up", "down"):
        r = cli("cluster", command, *base)
        assert r.exit_code == 2, r.output
        assert f"RayCluster {namespace}/theirs was not made by raytrain" in r.output
    after = rayclusters.get("theirs")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_down_refuses_while_rayjobs_use_the_raycluster_unless_forced(cli, namespace, rayclusters, rayjobs):
    base = ("--k8s", "--profile", EXAMPLE, "--namespace", namespace, "--name", "shared")
    assert cli("cluster", "up", *base).exit_code == 0
    rayjobs.apply({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "uses-it", "namespace": namespace},
                   "spec": {"entrypoint": "python -m raytrain.runtime.driver.entrypoint",
                            "clusterSelector": {"ray.io/cluster": "shared"}}})
    rayjobs.merge_patch("uses-it", {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, status=True)
    r = cli("cluster", "down", *base)
    assert r.exit_code == 2 and "RayJob uses-it (running)" in r.output and "give --force" in r.output, r.output
    assert rayclusters.get("shared") is not None
    r = cli("cluster", "down", *base, "--force")
    assert r.exit_code == 0 and rayclusters.get("shared") is None, r.output
