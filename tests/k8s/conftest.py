"""Fixtures for tests against a real Kubernetes API server.

The server is named by $RAYTRAIN_TEST_KUBECONFIG (a kubeconfig path), so the same tests run against the
shared loopback server (`../shared/k8s-apiserver/start.sh RUN_DIR` prints one; `.ci/run` starts it) or
against a real cluster (kind, a cloud cluster). Without it every test here is skipped, saying why.

The loopback server has no Pods and no KubeRay operator: tests play the operator by patching `/status`. Its
KubeRay CRDs are KubeRay 1.6.2's own (full schemas): a field KubeRay does not know is pruned, as on a real
cluster, and the server fills schema defaults (`with_defaults` says which).
Each test works in its own namespace and deletes what it created.
"""
import copy
import os
import secrets
import threading
import time
from pathlib import Path

import pytest
import yaml

from raytrain.clusters.k8s_client import schema_at
from tests.conftest import ROOT, needs

ENV = "RAYTRAIN_TEST_KUBECONFIG"
# KubeRay 1.6.2's own CRDs ($RAYTRAIN_TEST_KUBERAY_CRDS: the same file elsewhere, e.g. from a git worktree)
CRDS = Path(os.environ.get("RAYTRAIN_TEST_KUBERAY_CRDS")
            or ROOT.parent / "shared" / "k8s-apiserver" / "kuberay-crds-1.6.2.yaml")
REAL_MARK = "controller-gen.kubebuilder.io/version"  # on KubeRay's generated CRDs, not on hand-written stand-ins

def pytest_collection_modifyitems(config, items):
    if os.environ.get(ENV):
        return
    skip = pytest.mark.skip(
        reason=needs("a Kubernetes API server", f"${ENV} is not set: point it at a kubeconfig (../shared/k8s-apiserver/start.sh RUN_DIR "
        "prints one; .ci/run starts that server and sets it)")
    )
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    path = os.environ[ENV]
    assert Path(path).is_file(), f"${ENV}={path}: no such file"
    return path


@pytest.fixture(scope="session")
def kube(kubeconfig):
    """raytrain's own client for the test server (its errors are raytrain's one-line errors)."""
    from raytrain.clusters.k8s_client import Kube

    k = Kube.connect(kubeconfig)
    _ensure_crds(k)
    return k


def _ensure_crds(kube) -> None:
    """Install KubeRay 1.6.2's real CRDs where the server lacks them, and in place of the hand-written
    stand-ins an older run of these tests may have left (no controller-gen annotation); a real KubeRay install
    (annotated by controller-gen) is never touched."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube.api_client)
    served = {c.metadata.name: c for c in ext.list_custom_resource_definition().items}
    wanted = list(yaml.safe_load_all(CRDS.read_text())) if CRDS.is_file() else []
    if not wanted:
        if {"rayjobs.ray.io", "rayclusters.ray.io"} <= set(served):
            return
        pytest.fail(f"the server lacks the KubeRay CRDs and {CRDS} is not there to create them")
    changed = []
    for doc in wanted:
        name = doc["metadata"]["name"]
        have = served.get(name)
        if have is None:
            ext.create_custom_resource_definition(doc)
            changed.append(name)
        elif REAL_MARK not in (have.metadata.annotations or {}):  # a stand-in: replace it with the real one
            doc = {**doc, "metadata": {**doc["metadata"], "resourceVersion": have.metadata.resource_version}}
            ext.replace_custom_resource_definition(name, doc)
            changed.append(name)
    deadline = time.monotonic() + 30
    for name in changed:
        while True:
            crd = ext.read_custom_resource_definition(name)
            conditions = {c.type: c.status for c in (crd.status.conditions or [])}
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not established in 30 s"
            time.sleep(0.2)
    if changed:
        time.sleep(1.0)  # discovery and the new schema catch up


@pytest.fixture(scope="session")
def schemas(kube) -> dict:
    """The installed CRDs' openAPIV3Schema by kind (RayCluster, RayJob)."""
    return {kind: kube.crd_schema(plural) for kind, plural in (("RayCluster", "rayclusters"), ("RayJob", "rayjobs"))}


def with_defaults(value, schema: dict):
    """``value`` as the API server stores it: every schema default filled in where the value leaves it out
    (recursively, as the server's structural defaulting does); nothing else added or changed."""
    schema = schema or {}
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out = {}
        for key, item in value.items():
            sub = props.get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            out[key] = with_defaults(item, sub or {})
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = with_defaults(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list):
        return [with_defaults(item, schema.get("items") or {}) for item in value]
    return value


@pytest.fixture(scope="session")
def stored(schemas):
    """``stored(manifest)``: the spec the server keeps for a RayCluster/RayJob manifest (schema defaults added)."""
    return lambda manifest: with_defaults(manifest["spec"], schema_at(schemas[manifest["kind"]], "spec"))


@pytest.fixture
def namespace(kube):
    """A fresh namespace; everything raytrain created in it is deleted afterwards."""
    from kubernetes import client

    name = f"rt-test-{secrets.token_hex(4)}"
    core = client.CoreV1Api(kube.api_client)
    created = False
    try:  # a real cluster needs the Namespace object; the loopback server has no core API (404)
        core.create_namespace({"metadata": {"name": name}})
        created = True
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    yield name
    from raytrain.clusters.k8s_client import RayObjects

    for plural in ("rayjobs", "rayclusters"):
        objs = RayObjects(kube, plural, name)
        for obj in objs.list():
            objs.delete(obj["metadata"]["name"])
    if created:
        core.delete_namespace(name)


@pytest.fixture
def rayjobs(kube, namespace):
    from raytrain.clusters.k8s_client import RayObjects

    return RayObjects(kube, "rayjobs", namespace)


@pytest.fixture
def rayclusters(kube, namespace):
    from raytrain.clusters.k8s_client import RayObjects

    return RayObjects(kube, "rayclusters", namespace)


@pytest.fixture
def cli(kubeconfig, raytrain_home, monkeypatch):
    """Run `raytrain ...` in-process against the test server (KUBECONFIG set, fast RayJob polling)."""
    from click.testing import CliRunner

    from raytrain.cli.main import main

    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr("raytrain.targets.kuberay_rayjob.POLL_S", 0.05)

    def run(*args):
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


class Operator:
    """Plays KubeRay for one RayJob: waits for it, then patches its status through the given steps."""

    def __init__(self, rayjobs, name: str, steps: list[dict], pause_s: float = 0.3):
        self.rayjobs, self.name, self.steps, self.pause_s = rayjobs, name, steps, pause_s
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + 30
            while self.rayjobs.get(self.name) is None:
                assert time.monotonic() < deadline, f"RayJob {self.name} never appeared"
                time.sleep(0.05)
            for status in self.steps:
                time.sleep(self.pause_s)
                self.rayjobs.merge_patch(self.name, {"status": status}, status=True)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def __enter__(self) -> "Operator":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(timeout=60)
        if self.error is not None and exc[0] is None:
            raise self.error


@pytest.fixture
def operator(rayjobs):
    return lambda name, steps, pause_s=0.3: Operator(rayjobs, name, steps, pause_s)
