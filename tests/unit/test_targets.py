"""Every target's dry run is pure: it returns the exact request and changes neither the plan nor the target."""
import copy
import json

import pytest

from raytrain.capacity import Node
from raytrain.clusters.k8s_manifests import render_raycluster
from raytrain.clusters.profiles import load_cluster_profile
from raytrain.config import Options, resolve
from raytrain.errors import ConfigError
from raytrain.targets.factory import TargetOptions, make_target
from raytrain.targets.kuberay_portforward import KubeRayPortForwardTarget
from raytrain.targets.kuberay_rayjob import KubeRayJobTarget
from raytrain.targets.local import LocalTarget
from raytrain.targets.ray_jobs_api import RayJobsApiTarget
from tests.conftest import JOBS, ROOT

EXAMPLE = ROOT / "cluster" / "k8s-example.yaml"  # 2 worker pods of 8 GPUs; storage /mnt/checkpoints


class Conn:
    """A KubeConnection that is never used to connect: the namespace is always given."""

    def namespace(self, *candidates):
        return next(c for c in candidates if c)


def the_plan(**options):
    return resolve(Options(job=str(JOBS / "cnn.py"), **options), cluster_has_gpus=True)


def without_id(request) -> str:
    """The request as JSON, its fresh submission id (also the run name, the RayJob's name) masked."""
    return json.dumps(request.to_dict(), sort_keys=True, default=str).replace(request.submission_id, "<ID>")


def _local(tmp_path):
    return LocalTarget(auto_start=False)


def _address(tmp_path):
    target = RayJobsApiTarget("http://127.0.0.1:1")
    target.dashboard.nodes = lambda: [Node("n1", "10.0.0.1", {"CPU": 64.0, "GPU": 8.0})]  # no cluster here
    return target


def _rayjob(tmp_path):
    return KubeRayJobTarget(Conn(), profile=load_cluster_profile(EXAMPLE), namespace="team", working_dir="/app")


def _port_forward(tmp_path):
    target = KubeRayPortForwardTarget(Conn(), ray_cluster="shared", namespace="team", forwarder=lambda r: 1 / 0)
    target._raycluster = render_raycluster(load_cluster_profile(EXAMPLE), "shared", "team")  # as the server holds it
    return target


@pytest.mark.parametrize("make", [_local, _address, _rayjob, _port_forward])
def test_dry_run_is_pure(make, raytrain_home, tmp_path):
    target = make(tmp_path)
    plan = the_plan(workers=16, zero=3)
    before_plan, before_nodes = copy.deepcopy(plan), target.nodes()
    first = target.dry_run(plan)
    assert plan == before_plan  # the plan it was given is unchanged ...
    assert target.nodes() == before_nodes  # ... and so is what the target reports
    second = target.dry_run(plan)
    assert first.submission_id != second.submission_id  # a fresh id each time
    assert without_id(first) == without_id(second)  # otherwise the same request
    assert first.plan.storage == target.default_storage()  # the target's default storage, on a copy


def test_a_rayjobs_capacity_is_the_cluster_its_request_brings(raytrain_home, tmp_path):
    target = _rayjob(tmp_path)
    plan = the_plan(workers=24)  # 3 pods of 8 GPUs, where the profile has 2
    request = target.dry_run(plan)
    assert sum(n.resources.get("GPU", 0) for n in target.nodes()) == 16  # the profile's cluster
    assert sum(n.resources.get("GPU", 0) for n in target.nodes(request)) == 24  # the RayJob's own
    named = KubeRayJobTarget(Conn(), profile=load_cluster_profile(EXAMPLE), namespace="team", working_dir="/app",
                         submission_id="cnn-fixed")
    assert named.dry_run(plan).to_dict() == named.dry_run(plan).to_dict()  # a given id: the very same request


def test_the_factory_builds_every_target(raytrain_home, monkeypatch):
    assert isinstance(make_target(), LocalTarget)
    assert type(make_target(TargetOptions(address="http://h:8265"))) is RayJobsApiTarget
    monkeypatch.setenv("RAYTRAIN_ADDRESS", "http://h:8265")
    assert type(make_target()) is RayJobsApiTarget
    assert isinstance(make_target(TargetOptions(address="local")), LocalTarget)
    assert isinstance(make_target(TargetOptions(k8s=True, rayjob=True, namespace="team")), KubeRayJobTarget)
    with pytest.raises(ConfigError, match="--namespace is a Kubernetes option: add --k8s"):
        make_target(TargetOptions(namespace="team"))
    with pytest.raises(ConfigError, match="--address and --k8s"):
        make_target(TargetOptions(k8s=True, address="http://h:8265"))


def test_targets_say_how_to_reach_them_again(raytrain_home):
    assert LocalTarget().reconnect_flags() == []
    assert RayJobsApiTarget("http://h:8265").reconnect_flags() == ["--address", "http://h:8265"]
    # `jobs ... --k8s` alone looks at RayJobs; a job on a RayCluster's Jobs API needs --cluster (was dropped)
    assert _rayjob(None).reconnect_flags() == ["--k8s", "--namespace", "team"]
    assert _port_forward(None).reconnect_flags() == ["--k8s", "--cluster", "shared", "--namespace", "team"]
    assert LocalTarget().storage_is_local and not RayJobsApiTarget("http://h:8265").storage_is_local
    assert not LocalTarget(auto_start=False).running()  # before `cluster up`


def test_the_local_cluster_turns_off_ray_train_processes_it_has_no_use_for(raytrain_home, tmp_path):
    """Ray Train's preemption watcher (an actor process per job, polling for node drains) and its metrics are
    off on the local cluster, where a node is never drained and metrics are not collected; on any other
    cluster they stay as Ray sets them, and --env still overrides them everywhere."""
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=1, gpus_per_worker=0), cluster_has_gpus=False)
    local = _local(tmp_path).dry_run(plan).runtime_env["env_vars"]
    assert local["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0" and local["RAY_TRAIN_METRICS_ENABLED"] == "0"
    remote = _address(tmp_path).dry_run(plan).runtime_env["env_vars"]
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in remote and "RAY_TRAIN_METRICS_ENABLED" not in remote
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=1, gpus_per_worker=0,
                           env={"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}), cluster_has_gpus=False)
    assert _local(tmp_path).dry_run(plan).runtime_env["env_vars"]["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"


@pytest.mark.parametrize("make", [_local, _address, _rayjob, _port_forward])
def test_cpu_workers_get_the_allocator_settings_on_every_target(make, raytrain_home, tmp_path):
    """A job whose workers train on CPU runs with jemalloc where its nodes may be raytrain's, and with glibc's
    allocator keeping its memory between steps (GLIBC_TUNABLES in the job's environment, shown by the dry run);
    GPU workers keep the defaults; --env replaces the values, and an empty GLIBC_TUNABLES turns it off."""
    from raytrain.targets.base import CPU_ALLOCATOR_ENV_VARS

    def env_vars(**options):
        plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=2, **options), cluster_has_gpus=True)
        return make(tmp_path).dry_run(plan).runtime_env["env_vars"]

    cpu = env_vars(gpus_per_worker=0)
    assert cpu["GLIBC_TUNABLES"] == CPU_ALLOCATOR_ENV_VARS["GLIBC_TUNABLES"]
    assert {"glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold", "glibc.malloc.top_pad"} == {
        item.split("=")[0] for item in cpu["GLIBC_TUNABLES"].split(":")}
    assert "GLIBC_TUNABLES" not in env_vars(gpus_per_worker=1)
    # jemalloc where the nodes may be raytrain's (whose worker processes preload it); a Kubernetes pod starts
    # Ray from its image, where nothing would read the variable
    assert cpu.get("RAYTRAIN_CPU_ALLOCATOR") == (None if make in (_rayjob, _port_forward) else "jemalloc")
    assert "RAYTRAIN_CPU_ALLOCATOR" not in env_vars(gpus_per_worker=1)
    if make in (_local, _address):
        assert env_vars(gpus_per_worker=0, env={"RAYTRAIN_CPU_ALLOCATOR": "glibc"})["RAYTRAIN_CPU_ALLOCATOR"] == "glibc"
    assert env_vars(gpus_per_worker=0, env={"GLIBC_TUNABLES": ""})["GLIBC_TUNABLES"] == ""
    mine = "glibc.malloc.arena_max=2"
    assert env_vars(gpus_per_worker=0, env={"GLIBC_TUNABLES": mine})["GLIBC_TUNABLES"] == mine


def test_a_profiles_allocator_settings_win_over_raytrains(raytrain_home, tmp_path):
    """A Kubernetes profile's own GLIBC_TUNABLES (rayjob.runtime-env.env_vars) is kept; a job's --env wins
    over both."""
    target = _rayjob(tmp_path)
    target.profile.rayjob.runtime_env = {"env_vars": {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}}
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=2, gpus_per_worker=0), cluster_has_gpus=True)
    assert target.dry_run(plan).runtime_env["env_vars"]["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=4"
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=2, gpus_per_worker=0, env={"GLIBC_TUNABLES": ""}),
                   cluster_has_gpus=True)
    assert target.dry_run(plan).runtime_env["env_vars"]["GLIBC_TUNABLES"] == ""


@pytest.mark.parametrize("flags, named", [
    ({"checkpoint_every": 5}, "--checkpoint-every 5"),
    ({"max_failures": 2}, "--max-failures 2"),
    ({"workers": "1-2", "train_batch": 2}, "--workers 1-2"),
])
def test_recovery_without_shared_storage_is_refused_off_this_machine(flags, named, raytrain_home, tmp_path):
    """Checkpoints on one node's disk (or a RayJob's cluster, deleted after the job) cannot be resumed from."""
    from raytrain import api
    from raytrain.clusters.profiles import default_k8s_profile

    options = dict(job=str(JOBS / "cnn.py"), gpus_per_worker=1, **flags)
    no_storage_rayjob = KubeRayJobTarget(Conn(), profile=default_k8s_profile(), namespace="team", working_dir="/app")
    for target in (_address(tmp_path), no_storage_rayjob):
        with pytest.raises(ConfigError, match=f"{named} on .* with no --storage") as err:
            api.dry_run(Options(**options), target)
        assert err.value.flag == "--storage"
        api.dry_run(Options(**options, storage="s3://bucket/runs"), target)  # shared storage: fine
    api.dry_run(Options(**options), _rayjob(tmp_path))  # the profile's PVC is the default storage
    api.dry_run(Options(**options), _local(tmp_path))  # this machine: the storage is here
    api.dry_run(Options(job=str(JOBS / "cnn.py"), gpus_per_worker=1), _address(tmp_path))  # nothing to recover
