"""Fixtures for tests against a real Kubernetes API server.

The server is named by $RAYTRAIN_TEST_KUBECONFIG (a kubeconfig path), so the same tests run against the
shared loopback server (`../shared/k8s-apiserver/start.sh RUN_DIR` prints one; `.ci/run` starts it) or
against a real cluster (kind, a cloud cluster). Without it every test here is skipped, saying why.

The loopback server has no Pods and no KubeRay operator: tests play the operator by patching `/status`.
Each test works in its own namespace and deletes what it created.
"""
import os
import secrets
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, needs

ENV = "RAYTRAIN_TEST_KUBECONFIG"
CRDS = ROOT.parent / "shared" / "k8s-apiserver" / "kuberay-crds.yaml"

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
    """Apply the stand-in KubeRay CRDs where the server lacks them (never touches a real KubeRay install)."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube.api_client)
    served = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    wanted = list(yaml.safe_load_all(CRDS.read_text())) if CRDS.is_file() else []
    missing = [d for d in wanted if d["metadata"]["name"] not in served]
    if not missing and {"rayjobs.ray.io", "rayclusters.ray.io"} <= served:
        return
    if not wanted:
        pytest.fail(f"the server lacks the KubeRay CRDs and {CRDS} is not there to create stand-ins")
    for doc in missing:
        ext.create_custom_resource_definition(doc)
    deadline = time.monotonic() + 30
    for doc in missing:
        while True:
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            conditions = {c.type: c.status for c in (crd.status.conditions or [])}
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"CRD {doc['metadata']['name']} not established in 30 s"
            time.sleep(0.2)
    time.sleep(0.5)  # discovery catches up


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
    monkeypatch.setenv("RAYTRAIN_K8S_POLL_S", "0.05")

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
