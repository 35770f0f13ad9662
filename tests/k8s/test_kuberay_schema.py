"""Against KubeRay 1.6.2's real CRDs: everything raytrain renders is stored as sent (nothing pruned, nothing
refused; only the schema's defaults added), and a KubeRay without `authOptions` gets no RayJob."""
import copy
import time

import pytest
import yaml

from raytrain.clusters.k8s_client import Kube, RayObjects, schema_at
from raytrain.clusters.k8s_manifests import render_raycluster, render_rayjob
from raytrain.clusters.profiles import default_k8s_profile, load_cluster_profile, parse_cluster_profile
from tests.conftest import JOBS, ROOT
from tests.k8s.conftest import CRDS

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"

# Every profile key that changes a manifest, at a value other than its default.
EVERYTHING = {
    "kind": "kuberay", "name": "all", "ray-version": "2.60.0", "image": "example/ray:2.60.0",
    "image-pull-policy": "IfNotPresent", "service-account": "raytrain",
    "env": {"NCCL_DEBUG": "WARN"}, "env-from-secret": {"WANDB_API_KEY": "wandb/api-key",
                                                        "HF_TOKEN": {"secret": "hub", "key": "token"}},
    "labels": {"team": "ml"},
    "head": {"cpu": "2500m", "memory": "6Gi", "shm": None, "node-selector": {"pool": "cpu"},
             "tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}],
             "ray-start-params": {"dashboard-port": "8266"}},
    "workers": {"group-name": "gpus", "replicas": 2, "min-replicas": 1, "max-replicas": 4, "gpu": 2, "cpu": 16,
                "memory": "64Gi", "shm": "16Gi", "ray-start-params": {"object-store-memory": "1000000000"}},
    "storage": {"pvc": "ckpt", "mount-path": "/mnt/ckpt"},
    "rayjob": {"working-dir": "/app", "ttl-seconds-after-finished": 30, "active-deadline-seconds": 3600,
               "runtime-env": {"pip": ["six==1.16.0"]}},
    "security": {"run-as-user": 2000, "run-as-group": 2000, "fs-group": 2000, "automount-service-account-token": True,
                 "seccomp-profile": "Localhost/profiles/ray.json", "operator-namespace": "kuberay"},
    "preemption": {"save-seconds": 45},
}
BARE = {"kind": "kuberay", "name": "bare", "security": {"run-as-user": None, "run-as-group": None, "fs-group": None,
                                                         "seccomp-profile": None},
        "workers": {"gpu": 0, "shm": 0}, "rayjob": {"shutdown-after-job-finishes": False}}


def profiles():
    return [default_k8s_profile(), load_cluster_profile(EXAMPLE), parse_cluster_profile(copy.deepcopy(EVERYTHING)),
            parse_cluster_profile(copy.deepcopy(BARE))]


def rendered(namespace):
    """Every kind of manifest raytrain applies: RayClusters, RayJobs with their own cluster, RayJobs on one."""
    out = []
    for i, p in enumerate(profiles()):
        out.append(render_raycluster(p, f"rc-{i}", namespace))
        common = dict(namespace=namespace, entrypoint="python -m raytrain.runtime.driver.entrypoint",
                      runtime_env={"working_dir": "/app", "env_vars": {"A": "1"}}, metadata={"name": "cnn"}, profile=p)
        out.append(render_rayjob(name=f"own-{i}", cluster=None, worker_replicas=3,
                                 secret_env={"EXTRA": ("s", "k")}, **common))
        out.append(render_rayjob(name=f"on-{i}", cluster=f"rc-{i}", worker_replicas=0, **common))
    return out


def paths(value, prefix=""):
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in paths(v, f"{prefix}.{k}")} | {prefix}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in paths(v, f"{prefix}[{i}]")} | {prefix}
    return {prefix}


def test_every_manifest_raytrain_renders_is_stored_as_sent(kube, namespace, stored):
    manifests = rendered(namespace)
    assert {m["kind"] for m in manifests} == {"RayCluster", "RayJob"} and len(manifests) == 12
    for m in manifests:
        plural = {"RayCluster": "rayclusters", "RayJob": "rayjobs"}[m["kind"]]
        obj = RayObjects(kube, plural, namespace).apply(m)  # rejected: a one-line ClusterError here
        what = f"{m['kind']} {m['metadata']['name']}"
        lost = paths(m["spec"]) - paths(obj["spec"])
        assert not lost, f"{what}: the server pruned {sorted(lost)}"
        assert obj["spec"] == stored(m), what  # and added nothing but the schema's defaults
        assert {k: obj["metadata"][k] for k in m["metadata"]} == m["metadata"], what


def test_worker_pods_keep_their_grace_period_and_prestop(kube, namespace):
    """The preemption notice path (docs/preemption.md) survives KubeRay's schema: the worker pods' grace period
    (from the profile's planned save time, or its override) and preStop hook are stored as rendered."""
    for extra, grace in (({"save-seconds": 45}, 2 * 45 + 30), ({"grace-seconds": 900}, 900)):
        p = parse_cluster_profile({"kind": "kuberay", "name": "pre", "preemption": extra})
        m = render_raycluster(p, f"pre-{grace}", namespace)
        obj = RayObjects(kube, "rayclusters", namespace).apply(m)
        pod = obj["spec"]["workerGroupSpecs"][0]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert hook[:2] == ["/bin/sh", "-c"] and "/tmp/raytrain-preempt" in hook[2] and f"-lt {grace - 5}" in hook[2]
        assert {"name": "RAYTRAIN_PREEMPT_FILE", "value": "/tmp/raytrain-preempt"} in pod["containers"][0]["env"]
        assert "lifecycle" not in obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def test_the_defaults_helper_adds_only_defaults(stored):
    """The comparison above is only as strict as `stored`: it must not paper over a changed value."""
    m = render_raycluster(default_k8s_profile(), "x", "ns")
    spec = stored(m)
    assert spec["workerGroupSpecs"][0]["numOfHosts"] == 1
    assert all(p["protocol"] == "TCP" for p in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"])
    assert paths(spec) - paths(m["spec"])  # something was added ...
    assert stored(m)["authOptions"] == m["spec"]["authOptions"]  # ... and what was sent is unchanged


def test_a_field_kuberay_does_not_know_is_refused_by_server_side_apply(kube, namespace):
    """What makes the test above meaningful: raytrain's server-side apply is typed by KubeRay's schema, so an
    unknown field fails the apply (a merge patch would silently prune it; the comparison above catches that)."""
    from raytrain.errors import ClusterError

    m = render_raycluster(default_k8s_profile(), "unknown", namespace)
    m["spec"]["headGroupSpec"]["notAKubeRayField"] = True
    with pytest.raises(ClusterError, match="notAKubeRayField: field not declared in schema"):
        RayObjects(kube, "rayclusters", namespace).apply(m)


def _without_auth_options(schema):
    """A KubeRay < 1.5.1 CRD as raytrain reads it: no authOptions (the rest of the schema is 1.6.2's)."""
    schema = copy.deepcopy(schema)
    spec = schema_at(schema, "spec")
    for sub in (spec, schema_at(spec, "rayClusterSpec")):
        if sub is not None:
            sub["properties"].pop("authOptions", None)
    return schema


def test_rayjob_on_a_cluster_with_hand_set_auth_is_refused(cli, namespace, rayjobs, rayclusters):
    """A RayCluster whose Ray wants a token but whose spec has no authOptions (an older raytrain made it):
    the operator could never read its RayJobs' status."""
    old = render_raycluster(load_cluster_profile(EXAMPLE), "old", namespace)
    del old["spec"]["authOptions"]
    rayclusters.apply(old)
    r = cli("submit", JOBS / "cnn.py", "--k8s", "--rayjob", "--cluster", "old", "--namespace", namespace,
            "--working-dir", "/app", "--workers", "2", "--submission-id", "on-old", "--no-wait")
    assert r.exit_code == 2, r.output
    assert "RayCluster requires a Ray token but its spec has no authOptions" in r.output
    assert "leave out --rayjob" in r.output and len(r.output.strip().splitlines()) == 1
    assert rayjobs.list() == []
    # the same cluster made now (authOptions): accepted
    assert cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace, "--name", "new").exit_code == 0
    r = cli("submit", JOBS / "cnn.py", "--k8s", "--rayjob", "--cluster", "new", "--namespace", namespace,
            "--working-dir", "/app", "--workers", "2", "--submission-id", "on-new", "--no-wait")
    assert r.exit_code == 0, r.output


def test_env_from_secret_with_cluster_works_where_the_clusters_pods_have_it(cli, namespace, rayjobs, tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["env-from-secret"] = {"WANDB_API_KEY": "wandb/api-key"}
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump(data))
    assert cli("cluster", "up", "--profile", profile, "--namespace", namespace, "--name", "keys").exit_code == 0
    base = ("submit", JOBS / "cnn.py", "--k8s", "--cluster", "keys", "--namespace", namespace, "--workers", "2")
    for mode in ((), ("--rayjob", "--working-dir", "/app")):
        ok = cli(*base, *mode, "--env-from-secret", "WANDB_API_KEY=wandb/api-key", "--dry-run")
        assert ok.exit_code == 0, ok.output
        bad = cli(*base, *mode, "--env-from-secret", "HF_TOKEN=hub/token", "--dry-run")
        assert bad.exit_code == 2, bad.output
        assert "--env-from-secret HF_TOKEN=hub/token: the pods of RayCluster keys already run" in bad.output
        assert "`env-from-secret: {HF_TOKEN: hub/token}`" in bad.output
    assert rayjobs.list() == []


def _replace_crds(kube, docs) -> None:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube.api_client)
    for doc in docs:
        name = doc["metadata"]["name"]
        have = ext.read_custom_resource_definition(name)
        doc = {**doc, "metadata": {**doc["metadata"], "resourceVersion": have.metadata.resource_version}}
        ext.replace_custom_resource_definition(name, doc)
    deadline = time.monotonic() + 30

    def served(doc):
        crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        return conditions.get("Established") == "True" and crd.metadata.annotations == doc["metadata"].get("annotations")

    while not all(served(d) for d in docs):
        assert time.monotonic() < deadline, "the replaced CRDs were not served in 30 s"
        time.sleep(0.2)
    time.sleep(1.0)  # the apply path's typed schema catches up


@pytest.fixture(scope="module")
def old_kuberay(kube):
    """The server's KubeRay CRDs as a KubeRay < 1.5.1 has them: 1.6.2's, less `authOptions` (and less the
    controller-gen mark, so an interrupted run's next session puts the real ones back). Module-scoped (a CRD
    swap takes the server seconds): the tests that use it come last in this file."""
    real = list(yaml.safe_load_all(CRDS.read_text()))
    old = []
    for doc in copy.deepcopy(real):
        doc["metadata"].pop("annotations", None)
        for version in doc["spec"]["versions"]:
            version["schema"]["openAPIV3Schema"] = _without_auth_options(version["schema"]["openAPIV3Schema"])
        old.append(doc)
    _replace_crds(kube, old)
    try:
        yield
    finally:
        _replace_crds(kube, real)


@pytest.fixture
def crds_unreadable(monkeypatch):
    """A user whose credentials may not read CRDs (cluster-scoped): raytrain cannot look first."""
    monkeypatch.setattr(Kube, "crd_schema", lambda self, *a, **k: None)


def test_cluster_up_on_a_kuberay_without_auth_options_keeps_ray_authenticated(cli, namespace, rayclusters,
                                                                              old_kuberay):
    r = cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace, "--name", "older")
    assert r.exit_code == 0, r.output
    assert "no spec.authOptions (KubeRay >= 1.5.1 needed)" in r.output and "--rayjob --cluster` is refused" in r.output
    spec = rayclusters.get("older")["spec"]
    assert "authOptions" not in spec  # such a KubeRay's server-side apply would refuse the whole object
    env = {e["name"]: e for e in spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"  # Ray still requires the token
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "older-raytrain-auth", "key": "auth_token"}


def test_a_kuberay_without_auth_options_gets_no_rayjob_and_one_line(cli, namespace, rayjobs, old_kuberay):
    r = cli("submit", JOBS / "cnn.py", "--k8s", "--rayjob", "--namespace", namespace, "--working-dir", "/app",
            "--workers", "2", "--gpus-per-worker", "0", "--submission-id", "too-old", "--no-wait")
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "no spec.authOptions (KubeRay >= 1.5.1 needed)" in line
    assert "leave out --rayjob" in line and "--k8s --cluster NAME" in line  # the port-forward path
    assert rayjobs.list() == []


def test_unreadable_crds_on_an_older_kuberay_still_give_an_authenticated_cluster_and_no_rayjob(
        cli, namespace, rayclusters, rayjobs, old_kuberay, crds_unreadable):
    """raytrain cannot read the schema: the server-side apply refuses authOptions, and raytrain says what
    it says when it could read it."""
    r = cli("cluster", "up", "--profile", EXAMPLE, "--namespace", namespace, "--name", "blind")
    assert r.exit_code == 0, r.output
    assert "no spec.authOptions (KubeRay >= 1.5.1 needed)" in r.output
    spec = rayclusters.get("blind")["spec"]
    assert "authOptions" not in spec
    env = {e["name"]: e for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    r = cli("submit", JOBS / "cnn.py", "--k8s", "--rayjob", "--namespace", namespace, "--working-dir", "/app",
            "--workers", "2", "--gpus-per-worker", "0", "--submission-id", "blind-job", "--no-wait")
    assert r.exit_code == 2, r.output
    assert "no spec.authOptions (KubeRay >= 1.5.1 needed)" in r.output and len(r.output.strip().splitlines()) == 1
    assert rayjobs.list() == []
