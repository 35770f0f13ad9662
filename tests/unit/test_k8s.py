"""Kubernetes support without an API server: profiles, manifests, state mapping, CLI errors, lazy import."""
import json
import subprocess
import sys
import time

import pytest
import yaml
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.errors import ConfigError
from raytrain.status import JobState
from raytrain.clusters.profiles import K8sProfile, LocalProfile, load_cluster_profile, parse_cluster_profile
from raytrain.clusters.k8s_names import check_name
from raytrain.clusters.k8s_manifests import (
    security_manifests,
    nodes_from_spec,
    rayjob_name,
    render_raycluster,
    render_raycluster_spec,
    worker_pods_needed,
)
from raytrain.status import rayjob_state
from tests.conftest import JOBS, ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"
CNN = str(JOBS / "cnn.py")


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, env=env)


# -- profiles ------------------------------------------------------------------------------------------
def test_shipped_profiles_load():
    local = load_cluster_profile(ROOT / "cluster" / "local.yaml")
    assert isinstance(local, LocalProfile) and local.num_cpus == 2 and local.dashboard_port == 8265
    k8s = load_cluster_profile(EXAMPLE)
    assert isinstance(k8s, K8sProfile) and k8s.namespace == "ml"
    assert k8s.workers.gpu == 8 and k8s.workers.replicas == 2 and k8s.storage.path == "/mnt/checkpoints"
    assert k8s.head.gpu == 0 and k8s.workers.tolerations[0]["key"] == "nvidia.com/gpu"


def test_k8s_raycluster_yaml_is_what_the_example_profile_renders():
    profile = load_cluster_profile(EXAMPLE)
    shipped = list(yaml.safe_load_all((ROOT / "k8s" / "raycluster.yaml").read_text()))
    assert shipped == [
        render_raycluster(profile, profile.name, profile.namespace),
        *security_manifests(profile.name, profile.namespace, profile),
    ]


def test_profile_keys_in_any_case_and_defaults_kept():
    p = parse_cluster_profile({"kind": "kuberay", "rayVersion": "2.60.0", "workers": {"groupName": "w", "gpu": 2}})
    assert p.workers.group_name == "w" and p.workers.gpu == 2
    assert p.workers.cpu == "8" and p.workers.shm == "8Gi"  # the GPU group's defaults, not a bare group's


@pytest.mark.parametrize(
    "data, message",
    [
        ({"kind": "kuberay", "workers": {"gpus": 1}}, "unknown key workers.'gpus'"),
        ({"kind": "kuberay", "head": {"memory": "lots"}}, "head.memory 'lots': not a Kubernetes quantity"),
        ({"kind": "kuberay", "name": "Bad_Name"}, "invalid RayCluster name"),
        ({"kind": "kuberay", "namespace": "UPPER"}, "invalid namespace"),
        ({"kind": "kuberay", "workers": {"replicas": -1}}, "workers.replicas -1: must be an integer >= 0"),
        ({"kind": "kuberay", "workers": {"tolerations": {"key": "x"}}}, "tolerations must be a list"),
        ({"kind": "slurm"}, "kind 'slurm': use `kind: local` or `kind: kuberay`"),
        ({"kind": "local", "num-cpus": -2}, "num-cpus -2: must be a number >= 0"),
    ],
)
def test_bad_profiles_are_one_line_config_errors(data, message):
    with pytest.raises(ConfigError) as err:
        parse_cluster_profile(data, "p.yaml")
    assert message in str(err.value) and str(err.value).startswith("--profile p.yaml: ")


# -- manifests -----------------------------------------------------------------------------------------
def test_raycluster_spec_cpu_head_gpu_workers_shm_and_clusterip():
    spec = render_raycluster_spec(load_cluster_profile(EXAMPLE))
    head = spec["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    res = worker["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "8"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in worker["volumes"]
    nodes = nodes_from_spec(spec)
    assert [n.resources for n in nodes] == [{"CPU": 0.0, "GPU": 0.0}] + [{"CPU": 64.0, "GPU": 8.0}] * 2


def test_worker_pods_needed_for_a_rayjobs_own_cluster():
    p = load_cluster_profile(EXAMPLE)  # 8 GPUs, 64 CPUs per pod
    assert worker_pods_needed(p, 16, {"CPU": 1, "GPU": 1}) == 2
    assert worker_pods_needed(p, 17, {"CPU": 1, "GPU": 1}) == 3
    assert worker_pods_needed(p, 4, {"CPU": 32}) == 2
    with pytest.raises(ConfigError, match="a worker pod of the profile has 64 CPU, 8 GPU"):
        worker_pods_needed(p, 1, {"CPU": 1, "GPU": 16})


def test_names():
    assert check_name("RayJob", "a" * 47, flag="--x")
    for bad in ("a" * 48, "Abc", "1abc", "abc-", "a_b", ""):
        with pytest.raises(ConfigError):
            check_name("RayJob", bad, flag="--x")
    assert check_name("RayCluster", "c" * 53, flag="--x")
    for job in ("gpt_zero", "My_Job.v2", "0day", "x" * 80, "___"):
        name = rayjob_name(job)
        assert check_name("RayJob", name, flag="--x") and name != rayjob_name(job)


@pytest.mark.parametrize(
    "status, state",
    [
        ({}, JobState.PENDING),
        ({"jobDeploymentStatus": "Initializing"}, JobState.PENDING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "PENDING"}, JobState.PENDING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, JobState.RUNNING),
        ({"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED"}, JobState.FAILED),
        ({"jobDeploymentStatus": "Retrying"}, JobState.RESTARTING),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, JobState.SUCCEEDED),
        ({"jobDeploymentStatus": "Running", "jobStatus": "SUCCEEDED"}, JobState.SUCCEEDED),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, JobState.STOPPED),
        ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}, JobState.FAILED),
        ({"jobDeploymentStatus": "Failed"}, JobState.FAILED),  # e.g. the cluster never became ready
        ({"jobDeploymentStatus": "ValidationFailed"}, JobState.FAILED),
        ({"jobDeploymentStatus": "Suspending", "jobStatus": "RUNNING"}, JobState.STOPPED),
        ({"jobDeploymentStatus": "Suspended"}, JobState.STOPPED),
    ],
)
def test_rayjob_status_maps_to_job_state(status, state):
    assert rayjob_state(status) is state


# -- the CLI without a server --------------------------------------------------------------------------
def test_rayjob_dry_run_needs_no_cluster_when_the_namespace_is_given(raytrain_home, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none")}
    r = run("submit", CNN, "--k8s", "--rayjob", "-n", "team", "--working-dir", "/app", "--workers", "2",
            "--gpus-per-worker", "0", "--dry-run", env=env)
    assert r.exit_code == 0, r.output
    doc, policy = yaml.safe_load_all(r.output)
    assert policy["kind"] == "NetworkPolicy" and "secretKeyRef" not in r.output.split("---")[1]
    assert doc["kind"] == "RayJob" and doc["metadata"]["namespace"] == "team"
    assert doc["metadata"]["name"].startswith("cnn-") and doc["spec"]["jobId"] == doc["metadata"]["name"]
    out = json.loads(run("submit", CNN, "--k8s", "--rayjob", "-n", "team", "--working-dir", "/app",
                         "--dry-run", "--json", env=env).output)
    assert out["manifests"][0]["kind"] == "RayJob" and out["plan"]["scaling"]["use_gpu"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["jobs", "list", "--k8s"], "no kubeconfig: KUBECONFIG="),
        (["cluster", "up", "--k8s"], "no kubeconfig: KUBECONFIG="),
        (["submit", CNN, "--k8s", "--cluster", "c"], "no kubeconfig: KUBECONFIG="),
        (["submit", CNN, "--rayjob"], "--rayjob is a Kubernetes option: add --k8s"),
        (["jobs", "stop", "x", "--namespace", "a"], "--namespace is a Kubernetes option: add --k8s"),
        (["cluster", "down", "--name", "x"], "--name is a Kubernetes option: add --k8s"),
        (["submit", CNN, "--k8s", "--working-dir", "/app", "-n", "a"], "--working-dir is for --rayjob"),
        (["submit", CNN, "--k8s", "--address", "http://h:8265"], "--address and --k8s"),
        (["cluster", "up", "--dry-run"], "--dry-run: only with --k8s"),
        (["cluster", "up", "--k8s", "--num-gpus", "1"], "--num-gpus is for the local cluster"),
        (["cluster", "up", "--k8s", "--profile", ROOT / "cluster" / "local.yaml"], "a `kind: local` profile"),
    ],
)
def test_k8s_usage_errors_exit_2_in_one_line(raytrain_home, tmp_path, args, message):
    r = run(*args, env={"KUBECONFIG": str(tmp_path / "missing")})
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_no_kubeconfig_at_all(raytrain_home, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    r = run("jobs", "list", "--k8s")
    assert r.exit_code == 2
    assert "no kubeconfig: ~/.kube/config does not exist and KUBECONFIG is not set" in r.output


def _kubeconfig(tmp_path, server="https://127.0.0.1:9", contexts=("here",), current="here"):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": "u", "namespace": f"ns-{n}"}} for n in contexts],
        "current-context": current,
    }))
    return path


def test_unreachable_api_server_fails_fast_in_one_line(raytrain_home, tmp_path):
    env = {"KUBECONFIG": str(_kubeconfig(tmp_path))}
    start = time.monotonic()
    r = run("cluster", "up", "--k8s", env=env)
    assert r.exit_code == 2
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:9" in r.output
    assert "context 'here'" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert time.monotonic() - start < 15


def test_context_and_namespace_come_from_the_kubeconfig_like_kubectl(raytrain_home, tmp_path):
    from raytrain.clusters.k8s_client import Kube

    path = _kubeconfig(tmp_path, contexts=("here", "there"))
    kube = Kube.connect(str(path))
    assert (kube.context, kube.namespace, kube.server) == ("here", "ns-here", "https://127.0.0.1:9")
    assert Kube.connect(str(path), "there").namespace == "ns-there"
    r = run("jobs", "list", "--k8s", "--kubeconfig", path, "--context", "elsewhere")
    assert r.exit_code == 2 and "--context elsewhere: not in --kubeconfig" in r.output
    assert "contexts: here, there" in r.output


def test_local_profile_fills_cluster_up_flags(raytrain_home, monkeypatch):
    from raytrain.clusters.base import ClusterOptions
    from raytrain.clusters.factory import make_cluster

    got = make_cluster(ClusterOptions(profile=str(ROOT / "cluster" / "local.yaml"), port=7000)).settings()
    assert got == {"num_cpus": 2, "num_gpus": None, "port": 7000, "dashboard_port": 8265}


def test_cli_never_imports_the_kubernetes_client_without_k8s(raytrain_home, tmp_path):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from raytrain.cli.main import main\n"
        "for args in (['--help'], ['submit', '--help'], ['submit', %r, '--dry-run', '--json'],\n"
        "             ['jobs', 'list'], ['cluster', 'status'], ['cluster', 'up', '--help'],\n"
        "             ['submit', %r, '--k8s', '--rayjob', '-n', 'a', '--working-dir', '/app', '--dry-run']):\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    assert r.exit_code == 0, (args, r.output)\n"
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))\n"
        "r = CliRunner().invoke(main, ['jobs', 'list', '--k8s'])\n"
        "print('kubernetes' in sys.modules)\n"
    ) % (CNN, CNN)
    env = {**__import__("os").environ, "KUBECONFIG": str(_kubeconfig(tmp_path))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True"]  # loaded only once --k8s talks to a cluster
