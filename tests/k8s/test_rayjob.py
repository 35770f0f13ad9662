"""`raytrain submit --k8s --rayjob` and `jobs --k8s` against a real API server; the test plays KubeRay."""
import json

import pytest
import yaml

from raytrain.errors import ClusterError
from tests.conftest import JOBS, ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"
CNN = JOBS / "cnn.py"


@pytest.fixture
def cpu_profile(tmp_path):
    """A small CPU-only cluster profile (workers: 4 CPU pods)."""
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "kuberay",
        "name": "cpu",
        "image": "rayproject/ray:2.60.0-py311",
        "head": {"cpu": 1, "memory": "2Gi"},
        "workers": {"group-name": "cpu-workers", "replicas": 1, "cpu": 4, "memory": "8Gi", "gpu": 0, "shm": "1Gi"},
        "rayjob": {"working-dir": "/app", "ttl-seconds-after-finished": 60},
    }))
    return path


def rayjob_args(namespace, profile, *extra):
    return ("submit", CNN, "--k8s", "--rayjob", "--profile", profile, "--namespace", namespace,
            "--workers", "2", "--zero", "1", *extra)


def test_dry_run_manifest_is_exactly_what_submit_creates(cli, namespace, rayjobs, stored):
    args = ("submit", CNN, "--k8s", "--rayjob", "--profile", EXAMPLE, "--namespace", namespace,
            "--working-dir", "s3://bucket/code/cnn.zip", "--submission-id", "cnn-exact",
            "--workers", "16", "--zero", "3", "--precision", "bf16", "--grad-accum", "4")
    job_args = ("--", "--steps", "5")
    dry = cli(*args, "--dry-run", *job_args)
    assert dry.exit_code == 0, dry.output
    manifest = next(yaml.safe_load_all(dry.output))
    assert rayjobs.list() == []  # a dry run creates nothing

    r = cli(*args, "--no-wait", *job_args)
    assert r.exit_code == 0, r.output
    assert "submitted cnn-exact" in r.output
    obj = rayjobs.get("cnn-exact")
    # KubeRay's schema accepted it, and what it stores is what the dry run printed (plus the schema's defaults)
    assert obj["spec"] == stored(manifest)
    assert {k: obj["metadata"][k] for k in manifest["metadata"]} == manifest["metadata"]

    spec = obj["spec"]
    assert spec["entrypoint"] == "python -m raytrain.runtime.driver.entrypoint"
    assert spec["jobId"] == "cnn-exact" and spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 600
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"] == "s3://bucket/code/cnn.zip"
    plan = json.loads(runtime_env["env_vars"]["RAYTRAIN_PLAN"])
    assert plan["zero"] == 3 and plan["job_args"] == ["--steps", "5"] and plan["scaling"]["use_gpu"] is True
    assert plan["storage"] == "/mnt/checkpoints"  # the profile's shared storage is the run's default
    # its own cluster, sized for the job: 16 GPU workers on pods of 8 GPUs = 2 pods
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert spec["rayClusterSpec"]["headGroupSpec"]["serviceType"] == "ClusterIP"


def test_submit_follows_running_to_succeeded(cli, namespace, cpu_profile, operator):
    steps = [
        {"jobDeploymentStatus": "Initializing"},
        {"jobDeploymentStatus": "Running", "jobStatus": "PENDING", "rayClusterName": "cnn-ok-raycluster-abcde"},
        {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": "2026-12-01T10:00:00Z"},
        {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": "2026-12-01T10:05:00Z",
         "message": "Job finished successfully."},
    ]
    with operator("cnn-ok", steps):
        r = cli(*rayjob_args(namespace, cpu_profile, "--submission-id", "cnn-ok"))
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"submitted cnn-ok to k8s namespace {namespace}" in out
    order = [out.index(s) for s in (
        "deployment Initializing", "deployment Running, job PENDING", "deployment Running, job RUNNING",
        "deployment Complete, job SUCCEEDED",
    )]
    assert order == sorted(order), out
    assert "cnn-ok succeeded" in out


def test_submit_reports_failed_with_its_message_and_exit_1(cli, namespace, cpu_profile, operator):
    steps = [
        {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
        {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
         "message": "Job entrypoint command failed with exit code 1"},
    ]
    with operator("cnn-bad", steps):
        r = cli(*rayjob_args(namespace, cpu_profile, "--submission-id", "cnn-bad"))
    assert r.exit_code == 1, r.output
    assert "raytrain: error: job cnn-bad failed: AppFailed: Job entrypoint command failed with exit code 1" in r.output


def test_validation_failure_by_the_operator_is_a_failure(cli, namespace, cpu_profile, operator):
    steps = [{"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
              "message": "The RayJob spec is invalid: something"}]
    with operator("cnn-inv", steps, pause_s=0.1):
        r = cli(*rayjob_args(namespace, cpu_profile, "--submission-id", "cnn-inv"))
    assert r.exit_code == 1 and "The RayJob spec is invalid: something" in r.output, r.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--submission-id", "Bad_Id"], "--submission-id 'Bad_Id': invalid RayJob name"),
        (["--submission-id", "x" * 48], "invalid RayJob name; use 1-47"),
        (["--cluster", "No_Such"], "--cluster 'No_Such': invalid RayCluster name"),
        (["--cluster", "absent"], "no RayCluster 'absent' in namespace"),
        (["--zero", "5"], "--zero 5: unknown ZeRO stage"),
        (["--gpus-per-worker", "1"], "a worker pod of the profile has 4 CPU, 0 GPU"),
        (["--working-dir", "relative/dir"], "--working-dir relative/dir: the cluster cannot see this machine's"),
    ],
)
def test_invalid_input_is_refused_before_anything_is_created(cli, namespace, rayjobs, cpu_profile, extra, message):
    r = cli(*rayjob_args(namespace, cpu_profile, *extra), "--no-wait")
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert rayjobs.list() == []


def test_invalid_namespace_and_missing_working_dir(cli, rayjobs):
    r = cli("submit", CNN, "--k8s", "--rayjob", "--namespace", "Bad_NS", "--working-dir", "/app")
    assert r.exit_code == 2 and "--namespace 'Bad_NS': invalid namespace" in r.output
    r = cli("submit", CNN, "--k8s", "--rayjob", "--namespace", rayjobs.namespace)
    assert r.exit_code == 2 and "give --working-dir" in r.output
    assert rayjobs.list() == []


def test_a_retried_submission_never_starts_the_job_twice(cli, namespace, rayjobs, cpu_profile):
    args = rayjob_args(namespace, cpu_profile, "--submission-id", "cnn-retry", "--no-wait")
    assert cli(*args).exit_code == 0
    first = rayjobs.get("cnn-retry")
    r = cli(*args)  # the same submission again, e.g. after a lost reply
    assert r.exit_code == 0, r.output
    assert [o["metadata"]["name"] for o in rayjobs.list()] == ["cnn-retry"]
    assert rayjobs.get("cnn-retry")["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    # the same id for a different job is refused, not applied over the running one
    r = cli(*rayjob_args(namespace, cpu_profile, "--submission-id", "cnn-retry", "--workers", "4", "--no-wait"))
    assert r.exit_code == 2 and "already exists" in r.output and "different spec" in r.output


def test_fresh_submission_ids_are_valid_and_distinct(cli, namespace, rayjobs, cpu_profile):
    for _ in range(2):
        r = cli(*rayjob_args(namespace, cpu_profile, "--name", "My_Job.v2", "--no-wait"))
        assert r.exit_code == 0, r.output
    names = [o["metadata"]["name"] for o in rayjobs.list()]
    assert len(set(names)) == 2 and all(n.startswith("my-job-v2-") and len(n) <= 47 for n in names), names


def test_rayjob_on_an_existing_raycluster_uses_its_cluster_selector(cli, namespace, rayjobs, cpu_profile):
    assert cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace, "--name", "shared").exit_code == 0
    r = cli(*rayjob_args(namespace, cpu_profile, "--cluster", "shared", "--submission-id", "on-shared",
                         "--gpus-per-worker", "1", "--no-wait"))
    assert r.exit_code == 0, r.output
    spec = rayjobs.get("on-shared")["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "shared"}
    assert "rayClusterSpec" not in spec and spec["shutdownAfterJobFinishes"] is False
    assert spec["ttlSecondsAfterFinished"] == 0  # the schema's default: no TTL (KubeRay refuses one without shutdown)
    plan = json.loads(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAYTRAIN_PLAN"])
    assert plan["storage"] == "/mnt/checkpoints"  # from the RayCluster's raytrain.io/storage annotation

    # the capacity check reads the RayCluster: 2 pods x 8 GPUs hold 16 workers, not 17
    r = cli(*rayjob_args(namespace, cpu_profile, "--cluster", "shared", "--gpus-per-worker", "1",
                         "--workers", "17", "--no-wait"))
    assert r.exit_code == 2 and "room for 16 worker(s)" in r.output, r.output


def test_jobs_list_status_and_stop(cli, namespace, rayjobs, rayclusters, cpu_profile):
    base = ("--k8s", "--namespace", namespace)
    assert cli(*rayjob_args(namespace, cpu_profile, "--submission-id", "own", "--no-wait")).exit_code == 0
    listed = json.loads(cli("jobs", "list", *base, "--json").output)
    assert [(j["id"], j["name"], j["state"]) for j in listed] == [("own", "cnn", "pending")]
    assert listed[0]["metadata"]["workers"] == "2"

    rayjobs.merge_patch("own", {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, status=True)
    info = json.loads(cli("jobs", "status", "own", *base, "--json").output)
    assert info["state"] == "running" and info["entrypoint"] == "python -m raytrain.runtime.driver.entrypoint"
    assert "state     running" in cli("jobs", "status", "own", *base).output

    # a RayJob with its own cluster is suspended: KubeRay stops the job and deletes its pods
    r = cli("jobs", "stop", "own", *base, "--no-wait")
    assert r.exit_code == 0, r.output
    assert rayjobs.get("own")["spec"]["suspend"] is True
    rayjobs.merge_patch("own", {"status": {"jobDeploymentStatus": "Suspended", "jobStatus": ""}}, status=True)
    assert json.loads(cli("jobs", "status", "own", *base, "--json").output)["state"] == "stopped"
    assert "had already ended" in cli("jobs", "stop", "own", *base).output

    # one on a shared RayCluster is deleted: KubeRay's finalizer stops its Ray job
    assert cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace, "--name", "shared").exit_code == 0
    r = cli(*rayjob_args(namespace, cpu_profile, "--cluster", "shared", "--submission-id", "guest",
                         "--gpus-per-worker", "1", "--no-wait"))
    assert r.exit_code == 0, r.output
    r = cli("jobs", "stop", "guest", *base)
    assert r.exit_code == 0 and "RayJob deleted" in r.output, r.output
    assert rayjobs.get("guest") is None

    r = cli("jobs", "status", "nope", *base)
    assert r.exit_code == 2 and f"no RayJob 'nope' in namespace {namespace}" in r.output


def test_a_missing_kuberay_crd_is_one_clear_line(kube, namespace):
    from raytrain.clusters.k8s_client import RayObjects

    absent = RayObjects(kube, "rayjobs", namespace, group="absent.raytrain.test")
    with pytest.raises(ClusterError) as err:
        absent.list()
    message = str(err.value)
    assert "the KubeRay CRD rayjobs.absent.raytrain.test (v1) is not installed on https://" in message
    assert "helm install kuberay-operator" in message and "\n" not in message
