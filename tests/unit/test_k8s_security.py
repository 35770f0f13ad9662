"""Kubernetes: Ray token auth from a Secret raytrain makes, a NetworkPolicy in front of the head, pods
without privileges, and raytrain's own client sending the token through the port-forward.

The shared loopback API server serves no core API (no Secrets, no NetworkPolicies), so ClusterGuard's
calls are checked here against a small in-memory stand-in for the two core endpoints it uses."""
import base64
import http.server
import json
import threading

import pytest
import yaml
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.clusters.k8s_auth import ClusterGuard
from raytrain.clusters.k8s_client import KubeConnection, NotFound
from raytrain.clusters.k8s_manifests import render_raycluster, render_rayjob, security_manifests
from raytrain.clusters.profiles import default_k8s_profile, parse_cluster_profile
from raytrain.targets.kuberay_portforward import KubeRayPortForwardTarget
from tests.conftest import JOBS, ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"


def pods(manifest):
    spec = manifest["spec"].get("rayClusterSpec") or manifest["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


def env_of(template):
    return {e["name"]: e for e in template["spec"]["containers"][0]["env"]}


def test_raycluster_pods_use_token_auth_from_the_secret_and_run_unprivileged():
    rc = render_raycluster(default_k8s_profile(), "c1", "ns")
    for t in pods(rc):
        env = env_of(t)
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"] == {
            "name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "c1-raytrain-auth", "key": "auth_token"}}}
        assert t["metadata"]["labels"]["raytrain.io/cluster"] == "c1"
        spec = t["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
        c = spec["containers"][0]["securityContext"]
        assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"]


def test_profile_security_keys():
    p = parse_cluster_profile({"kind": "kuberay", "service-account": "sa",
                               "security": {"automount-service-account-token": True, "run-as-user": None}})
    t = pods(render_raycluster(p, "c1", "ns"))[0]["spec"]
    assert t["automountServiceAccountToken"] is True and "runAsNonRoot" not in t["securityContext"]
    with pytest.raises(Exception, match="security.network-policy 'yes': must be true or false"):
        parse_cluster_profile({"kind": "kuberay", "security": {"network-policy": "yes"}})


def test_network_policy_covers_every_pod_of_the_cluster_and_admits_only_its_pods_and_the_operator():
    """Head and workers alike (rank 0's rendezvous store, gloo/NCCL and the object manager run on workers)."""
    [policy] = security_manifests("c1", "ns", default_k8s_profile())
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"raytrain.io/cluster": "c1"}}
    for template in pods(render_raycluster(default_k8s_profile(), "c1", "ns")):  # every pod is selected
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in spec["podSelector"]["matchLabels"].items())
    assert spec["policyTypes"] == ["Ingress"]
    own, operator = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"raytrain.io/cluster": "c1"}}}]}
    assert operator["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert operator["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kuberay-system"}


def test_rayjob_submitter_gets_the_token():
    p = default_k8s_profile()
    own = render_rayjob(name="j1", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                        cluster=None, worker_replicas=1)
    sub = own["spec"]["submitterPodTemplate"]
    assert env_of(sub)["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "j1-raytrain-auth", "key": "auth_token"}
    assert sub["metadata"]["labels"]["raytrain.io/cluster"] == "j1"  # admitted by the head's NetworkPolicy
    assert all(env_of(t)["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "j1-raytrain-auth" for t in pods(own))
    on = render_rayjob(name="j2", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                       cluster="c1", worker_replicas=0)
    ref = env_of(on["spec"]["submitterPodTemplate"])["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "c1-raytrain-auth", "key": "auth_token", "optional": True}


def test_dry_runs_show_no_token_and_no_secret(raytrain_home, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none")}
    for args in (["cluster", "up", "--k8s", "--profile", str(EXAMPLE), "--dry-run"],
                 ["submit", str(JOBS / "cnn.py"), "--k8s", "--rayjob", "-n", "t", "--working-dir", "/app",
                  "--workers", "2", "--gpus-per-worker", "0", "--dry-run"]):
        r = CliRunner().invoke(main, args, env=env)
        assert r.exit_code == 0, r.output
        kinds = [d["kind"] for d in yaml.safe_load_all(r.output)]
        assert "Secret" not in kinds and "NetworkPolicy" in kinds
        assert "stringData" not in r.output and "raytrain-auth (not shown" not in r.output
        assert "creates Secret" in r.output and "secretKeyRef" in r.output


class FakeCore:
    """The core endpoints ClusterGuard calls, in memory (the loopback API server serves none)."""

    def __init__(self):
        self.secrets, self.policies, self.patches = {}, {}, []

    def get_api_resources(self, **_):
        return {"resources": [{"name": "secrets"}]}

    def read_namespaced_secret(self, name, ns, **_):
        if name not in self.secrets:
            raise NotFound(name)
        data = self.secrets[name]["stringData"]
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}

    def create_namespaced_secret(self, ns, body, **_):
        self.secrets[body["metadata"]["name"]] = body
        return body

    def patch_namespaced_secret(self, name, ns, body, **_):
        self.patches.append(("Secret", name, body))
        return {}

    def patch_namespaced_network_policy(self, name, ns, body, **kw):
        if kw.get("_content_type") == "application/apply-patch+yaml":
            self.policies[name] = body
        else:
            self.patches.append(("NetworkPolicy", name, body))
        return body


class FakeKube:
    def __init__(self):
        self.core = FakeCore()

    def call(self, what, fn, *args, **kwargs):
        return fn(*args, **kwargs)


@pytest.fixture
def guard(monkeypatch):
    kube = FakeKube()
    monkeypatch.setattr(ClusterGuard, "networking", property(lambda self: kube.core))
    return ClusterGuard(kube, "ns"), kube.core


def test_guard_creates_one_fresh_token_and_keeps_it(guard):
    g, core = guard
    assert g.ensure("c1", default_k8s_profile()) is True
    token = g.read_token("c1")
    assert len(token) == 64 and core.secrets["c1-raytrain-auth"]["stringData"] == {"auth_token": token}
    assert "c1-raytrain-head" in core.policies
    g.ensure("c1", default_k8s_profile())  # `cluster up` again: running pods keep their token
    assert g.read_token("c1") == token
    g.ensure("c2", default_k8s_profile())
    assert g.read_token("c2") != token
    g.adopt("c1", {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c1", "uid": "u1"}})
    refs = {(kind, name): body["metadata"]["ownerReferences"][0]["uid"] for kind, name, body in core.patches}
    assert refs == {("Secret", "c1-raytrain-auth"): "u1", ("NetworkPolicy", "c1-raytrain-head"): "u1"}


class Recorder(http.server.BaseHTTPRequestHandler):
    seen = []

    def do_GET(self):
        Recorder.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"ray_version": "2.60.0"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_the_jobs_client_sends_the_clusters_token_through_the_tunnel(guard, monkeypatch):
    g, core = guard
    g.ensure("c1", default_k8s_profile())
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    server = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    class Forward:
        def __init__(self, request):
            pass

        def open(self):
            return f"http://127.0.0.1:{server.server_address[1]}"

        def close(self):
            pass

    conn = KubeConnection(kube=g.kube)
    target = KubeRayPortForwardTarget(conn, ray_cluster="c1", namespace="ns", forwarder=Forward)
    target._raycluster = render_raycluster(default_k8s_profile(), "c1", "ns")
    target.open()
    target.dashboard.check_reachable()
    server.shutdown()
    assert Recorder.seen[-1] == f"Bearer {g.read_token('c1')}"


def test_no_permission_to_read_the_secret_means_no_token_not_a_crash(guard, monkeypatch):
    from raytrain.errors import ClusterError

    g, core = guard

    def forbidden(*a, **k):
        raise ClusterError("the Kubernetes API server refused read Secret (HTTP 403)")

    monkeypatch.setattr(core, "read_namespaced_secret", forbidden)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    target = KubeRayPortForwardTarget(KubeConnection(kube=g.kube), ray_cluster="c1", namespace="ns")
    assert target.token() is None


# -- KubeRay's own token auth (authOptions), seccomp, env from Secrets --------------------------------------
def test_raycluster_and_rayjob_clusters_name_raytrains_secret_in_auth_options():
    """Without spec.authOptions KubeRay's operator sends no token to the head's dashboard, so a RayJob's status
    never advances on a token-protected cluster."""
    p = default_k8s_profile()
    rc = render_raycluster(p, "c1", "ns")
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": "c1-raytrain-auth"}
    own = render_rayjob(name="j1", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                        cluster=None, worker_replicas=1)
    assert own["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": "j1-raytrain-auth"}
    # the key KubeRay reads from that Secret is the one raytrain writes and the pods read
    assert env_of(pods(rc)[0])["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "auth_token"
    on = render_rayjob(name="j2", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                       cluster="c1", worker_replicas=0)
    assert "rayClusterSpec" not in on["spec"]  # an existing cluster's authOptions are its own


def test_a_secret_made_before_auth_options_gets_the_same_token_under_kuberays_key(guard):
    g, core = guard
    core.secrets["old-raytrain-auth"] = {"metadata": {"name": "old-raytrain-auth"}, "stringData": {"token": "t0"}}
    assert g.read_token("old") == "t0"

    def patch(name, ns, body, **kw):
        core.secrets[name]["stringData"].update(body.get("stringData") or {})
        return {}

    core.patch_namespaced_secret = patch
    g.ensure("old", default_k8s_profile())
    assert core.secrets["old-raytrain-auth"]["stringData"] == {"token": "t0", "auth_token": "t0"}


def test_pods_get_seccomp_runtime_default_unless_the_profile_says_otherwise():
    p = default_k8s_profile()
    own = render_rayjob(name="j1", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                        cluster=None, worker_replicas=1)
    templates = [*pods(render_raycluster(p, "c1", "ns")), *pods(own), own["spec"]["submitterPodTemplate"]]
    for t in templates:
        assert t["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    local = parse_cluster_profile({"kind": "kuberay", "security": {"seccomp-profile": "Localhost/profiles/ray.json"}})
    assert pods(render_raycluster(local, "c1", "ns"))[1]["spec"]["securityContext"]["seccompProfile"] == {
        "type": "Localhost", "localhostProfile": "profiles/ray.json"}
    off = parse_cluster_profile({"kind": "kuberay", "security": {"seccomp-profile": None, "run-as-user": None,
                                                                  "run-as-group": None, "fs-group": None}})
    assert "securityContext" not in pods(render_raycluster(off, "c1", "ns"))[0]["spec"]
    with pytest.raises(Exception, match="security.seccomp-profile 'strict': use RuntimeDefault, Unconfined"):
        parse_cluster_profile({"kind": "kuberay", "security": {"seccomp-profile": "strict"}})


def test_profile_env_from_secret_is_a_secret_key_ref_on_every_ray_container():
    p = parse_cluster_profile({"kind": "kuberay", "env": {"NCCL_DEBUG": "WARN"},
                               "env-from-secret": {"WANDB_API_KEY": "wandb/api-key",
                                                   "HF_TOKEN": {"secret": "hub", "key": "token"}}})
    rc = render_raycluster(p, "c1", "ns")
    own = render_rayjob(name="j1", namespace="ns", entrypoint="x", runtime_env={}, metadata={}, profile=p,
                        cluster=None, worker_replicas=1, secret_env={"HF_TOKEN": ("hub2", "t")})
    for t in pods(rc):
        env = env_of(t)
        assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY",
                                        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hub", "key": "token"}
        assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "WARN"}
    for t in pods(own):  # --env-from-secret wins over the profile's entry of the same name
        assert env_of(t)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hub2", "key": "t"}
        assert env_of(t)["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "wandb"


@pytest.mark.parametrize("value, message", [
    ({"A": "nokey"}, "env-from-secret A: 'nokey': expected NAME: SECRET/KEY"),
    ({"1A": "s/k"}, "expected NAME: SECRET/KEY"),
    ({"RAY_AUTH_TOKEN": "s/k"}, r"raytrain sets RAY_AUTH_\* itself"),
    (["A=s/k"], "env-from-secret must be a mapping"),
])
def test_bad_env_from_secret_in_a_profile_is_one_line(value, message):
    with pytest.raises(Exception, match=message):
        parse_cluster_profile({"kind": "kuberay", "env-from-secret": value}, "p.yaml")
    with pytest.raises(Exception, match="env and env-from-secret both set A"):
        parse_cluster_profile({"kind": "kuberay", "env": {"A": "1"}, "env-from-secret": {"A": "s/k"}})


def test_env_from_secret_with_an_existing_cluster_is_accepted_only_where_its_pods_read_it():
    from raytrain.clusters.k8s_manifests import require_secret_env
    from raytrain.errors import ConfigError

    with_it = render_raycluster(parse_cluster_profile(
        {"kind": "kuberay", "env-from-secret": {"WANDB_API_KEY": "wandb/api-key"}}), "c1", "ns")
    require_secret_env(with_it, {"WANDB_API_KEY": ("wandb", "api-key")}, "--env-from-secret")
    for wanted in ({"WANDB_API_KEY": ("other", "api-key")}, {"HF_TOKEN": ("hub", "token")}):
        with pytest.raises(ConfigError) as err:
            require_secret_env(with_it, wanted, "--env-from-secret")
        msg = str(err.value)
        assert "the pods of RayCluster c1 already run and do not read it" in msg and "env-from-secret:" in msg
        assert "\n" not in msg and err.value.flag == "--env-from-secret"


def test_a_cluster_with_hand_set_auth_and_no_auth_options_is_recognised():
    from raytrain.clusters.k8s_manifests import uses_hand_set_auth

    rc = render_raycluster(default_k8s_profile(), "c1", "ns")
    assert not uses_hand_set_auth(rc)
    del rc["spec"]["authOptions"]  # as an older raytrain (or an older KubeRay's schema) left it
    assert uses_hand_set_auth(rc)
    plain = render_raycluster(default_k8s_profile(), "c1", "ns")
    del plain["spec"]["authOptions"]
    for t in pods(plain):
        t["spec"]["containers"][0]["env"] = []
    assert not uses_hand_set_auth(plain)  # no token at all: the operator needs none


def test_a_port_forward_target_used_as_a_context_manager_closes_its_tunnel(guard):
    g, _ = guard
    events = []

    class Forward:
        def __init__(self, request):
            pass

        def open(self):
            events.append("open")
            return "http://127.0.0.1:9"

        def close(self):
            events.append("close")

    with KubeRayPortForwardTarget(KubeConnection(kube=g.kube), ray_cluster="c1", namespace="ns", forwarder=Forward,
                              token="t") as target:
        target._raycluster = render_raycluster(default_k8s_profile(), "c1", "ns")
        target.open()
        target.open()
    assert events == ["open", "close"]
    target.close()  # closing again is harmless
    assert events == ["open", "close"]
