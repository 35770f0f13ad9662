"""The torch-free backend: Ray Train's controller (and the driver) can unpickle and hold it without torch;
only the workers import Ray's torch helpers."""
import os
import subprocess
import sys

import pytest

from raytrain.ray_tuning import lazy_torch, lean_trainer
from raytrain.runtime.worker import early_imports
from raytrain.runtime.driver import preflight, trainer as torch_backend

CHECK = """
import sys, ray.cloudpickle as cp
config = cp.loads(sys.stdin.buffer.read())
backend = config.backend_cls()
assert type(backend).__name__ == "LazyTorchBackend" and backend.share_cuda_visible_devices
assert config.framework.value == "torch" and config.interface == "eth9" and config.timeout_s == 42
assert config.to_dict() == {"backend": None, "init_method": "env", "timeout_s": 42}
print("torch" in sys.modules, "deepspeed" in sys.modules)
"""


def test_the_controller_unpickles_the_backend_without_importing_torch():
    import ray.cloudpickle as cp

    config = lazy_torch.make_config(timeout_s=42.0, interface="eth9",
                                    before_process_group=preflight.before_process_group, prepare=early_imports.wait)
    out = subprocess.run([sys.executable, "-c", CHECK], input=cp.dumps(config), capture_output=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().split() == ["False", "False"]


def test_the_driver_builds_its_trainer_without_importing_torch():
    code = ("import sys\n"
            "from raytrain.runtime.driver import entrypoint as driver, trainer as torch_backend; from raytrain.runtime.worker import loop as worker\n"
            "from ray.train import ScalingConfig\n"
            "torch_backend.trainer(lambda c: None, backend_config_args={'timeout_s': 1, 'interface': None},\n"
            "                      scaling_config=ScalingConfig(num_workers=1))\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().split() == ["False"]


def test_process_group_backend_is_rays_choice():
    assert lazy_torch.process_group_backend(None, {"CPU": 1}) == "gloo"
    assert lazy_torch.process_group_backend(None, {"CPU": 1, "GPU": 1}) == "nccl"
    assert lazy_torch.process_group_backend(None, {"GPU": 0}) == "gloo"
    assert lazy_torch.process_group_backend("gloo", {"GPU": 1}) == "gloo"


def test_worker_side_helpers(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "unset")  # recorded by monkeypatch: both are put back after the test
    monkeypatch.setenv("MASTER_PORT", "unset")
    lazy_torch.set_master("10.0.0.1", 29500)
    assert os.environ["MASTER_ADDR"] == "10.0.0.1" and os.environ["MASTER_PORT"] == "29500"
    monkeypatch.setattr(lazy_torch, "RAY_TORCH", "os.path")  # the by-name call, without torch
    assert lazy_torch.call(None, "join", "a", "b") == os.path.join("a", "b")
    seen = []
    assert lazy_torch.call(lambda: seen.append(1), "join", "a") == "a" and seen == [1]


@pytest.mark.parametrize("env, lazy", [({}, True), ({"RAYTRAIN_RAY_TUNING": "off"}, False)])
def test_the_trainer_is_rays_torch_trainer_with_the_tunings_off(monkeypatch, env, lazy):
    from ray.train import ScalingConfig

    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    trainer = torch_backend.trainer(lambda config: None, backend_config_args={"timeout_s": 60.0, "interface": None},
                                    scaling_config=ScalingConfig(num_workers=2))
    names = {c.__name__ for c in type(trainer).__mro__}
    assert ("LeanDataParallelTrainer" in names) is lazy and ("TorchTrainer" in names) is not lazy, names
    backend = trainer.backend_config.backend_cls.__name__
    assert backend == ("LazyTorchBackend" if lazy else "_PreflightBackend"), backend


def _default_callback_names(datasets=None, local_cluster=None):
    from ray.train import ScalingConfig

    trainer = torch_backend.trainer(lambda config: None, backend_config_args={"timeout_s": 60.0, "interface": None},
                                    scaling_config=ScalingConfig(num_workers=2), datasets=datasets,
                                    local_cluster=local_cluster)
    return {type(c).__name__ for c in trainer._create_default_callbacks()}


def test_the_trainer_leaves_out_the_callbacks_raytrain_does_without(monkeypatch):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    names = _default_callback_names()
    assert "DatasetsCallback" not in names  # no datasets: no DatasetManager actor, no Ray Data context sent
    assert {"BackendSetupCallback", "PlacementGroupCleanerCallback"} <= names, names
    assert "PlacementGroupCleanerCallback" in _default_callback_names(local_cluster=False)
    # the plan says the run is on raytrain's local cluster (what the local target sets): no cleaner actor
    assert "PlacementGroupCleanerCallback" not in _default_callback_names(local_cluster=True)
    import ray.data

    assert "DatasetsCallback" in _default_callback_names({"train": ray.data.range(4)})  # given datasets: kept
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert {"DatasetsCallback", "PlacementGroupCleanerCallback"} <= _default_callback_names(local_cluster=True)


def _local_plan(tmp_path, monkeypatch):
    """The plan the local target submits (its RAYTRAIN_PLAN, read back as the driver reads it), and the plan
    it was given; no cluster is started (dry_run only builds the request)."""
    import json

    from raytrain.config import Options, resolve
    from raytrain.config.plan import Plan
    from raytrain.targets.local import LocalTarget

    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    job = tmp_path / "job" / "train.py"
    job.parent.mkdir()
    job.write_text("def train(ctx):\n    pass\n")
    given = resolve(Options(job=str(job), workers=2))
    request = LocalTarget(auto_start=False).dry_run(given)
    shipped = Plan.from_dict(json.loads(request.runtime_env["env_vars"]["RAYTRAIN_PLAN"]))
    return given, request, shipped


def test_the_local_target_says_in_the_plan_that_the_run_is_on_its_own_cluster(tmp_path, monkeypatch):
    given, request, shipped = _local_plan(tmp_path, monkeypatch)
    assert given.local_cluster is None  # not a flag, and the caller's plan is not changed by the dry run
    assert shipped.local_cluster is True and request.plan.local_cluster is True
    env = request.runtime_env["env_vars"]
    assert "RAYTRAIN_PG_CLEANER" not in env and "RAYTRAIN_AUTOSCALING_COORDINATOR" not in env, env


def test_another_target_leaves_local_cluster_unsaid(tmp_path, monkeypatch):
    from raytrain.config import Options, resolve
    from raytrain.targets.ray_jobs_api import RayJobsApiTarget

    job = tmp_path / "train.py"
    job.write_text("def train(ctx):\n    pass\n")
    request = RayJobsApiTarget("http://127.0.0.1:1", token="").dry_run(resolve(Options(job=str(job))))
    assert request.plan.local_cluster is None


def test_the_lean_trainers_decisions_follow_the_plan_not_the_environment(tmp_path, monkeypatch):
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy import create_scaling_policy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from raytrain.runtime.driver import entrypoint

    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    for name in ("RAYTRAIN_PG_CLEANER", "RAYTRAIN_AUTOSCALING_COORDINATOR"):  # the old switches: read by nothing
        monkeypatch.setenv(name, "1")
    _, _, shipped = _local_plan(tmp_path, monkeypatch)
    seen = {}
    monkeypatch.setattr(DataParallelTrainer, "_initialize_and_run_controller", lambda self, **kw: seen.update(kw))
    fixed = create_scaling_policy(ScalingConfig(num_workers=2))
    # the driver builds its trainer from the plan it read (build_trainer), as it does on the cluster
    job = entrypoint.Job(shipped, "run-1")
    trainer = entrypoint.build_trainer(job)
    assert "PlacementGroupCleanerCallback" not in {type(c).__name__ for c in trainer._create_default_callbacks()}
    trainer._initialize_and_run_controller(scaling_policy=fixed)
    assert type(seen["scaling_policy"]).__name__ == "FixedScalingPolicyWithoutCoordinator"
    # the same plan without local_cluster (any other target): Ray Train's cleaner and coordinator stay
    import dataclasses

    elsewhere = entrypoint.Job(dataclasses.replace(shipped, local_cluster=None), "run-1")
    for name in ("RAYTRAIN_PG_CLEANER", "RAYTRAIN_AUTOSCALING_COORDINATOR"):
        monkeypatch.setenv(name, "0")
    trainer = entrypoint.build_trainer(elsewhere)
    assert "PlacementGroupCleanerCallback" in {type(c).__name__ for c in trainer._create_default_callbacks()}
    trainer._initialize_and_run_controller(scaling_policy=fixed)
    assert seen["scaling_policy"] is fixed


def test_the_local_cluster_runs_fixed_size_jobs_without_the_autoscaling_coordinator(monkeypatch):
    """The policy makes the fixed policy's decisions and never calls the coordinator (no Ray here: the real
    policy would create the detached actor); it pickles for the controller actor; elastic runs keep theirs."""
    from ray import cloudpickle
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy import ResizeDecision, create_scaling_policy

    fixed = create_scaling_policy(ScalingConfig(num_workers=2))
    policy = cloudpickle.loads(cloudpickle.dumps(lean_trainer.without_coordinator(fixed)))
    policy.after_controller_start(type("Run", (), {"run_id": "abc"})())
    decision = policy.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
    assert policy._coordinator_client is None and policy._requester_id == "train-abc"
    policy.before_controller_abort()
    elastic = create_scaling_policy(ScalingConfig(num_workers=(1, 2)))
    assert lean_trainer.without_coordinator(elastic) is elastic

    seen = {}
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    monkeypatch.setattr(DataParallelTrainer, "_initialize_and_run_controller",
                        lambda self, **kw: seen.update(kw))
    def build(local_cluster):
        return torch_backend.trainer(lambda config: None, backend_config_args={"timeout_s": 60.0, "interface": None},
                                     scaling_config=ScalingConfig(num_workers=2), local_cluster=local_cluster)

    build(True)._initialize_and_run_controller(scaling_policy=fixed)
    assert type(seen["scaling_policy"]).__name__ == "FixedScalingPolicyWithoutCoordinator"
    for unsaid_or_not_local in (None, False):
        build(unsaid_or_not_local)._initialize_and_run_controller(scaling_policy=fixed)
        assert seen["scaling_policy"] is fixed
    # an elastic run keeps the coordinator everywhere, and asks it for a fresh view (tests/unit/test_elastic_view.py)
    for local_cluster in (True, None):
        build(local_cluster)._initialize_and_run_controller(scaling_policy=elastic)
        assert type(seen["scaling_policy"]).__name__ == "ElasticScalingPolicyWithFreshView"
        assert seen["scaling_policy"].scaling_config is elastic.scaling_config
