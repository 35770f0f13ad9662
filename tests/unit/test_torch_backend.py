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


def _default_callback_names(datasets=None):
    from ray.train import ScalingConfig

    trainer = torch_backend.trainer(lambda config: None, backend_config_args={"timeout_s": 60.0, "interface": None},
                                    scaling_config=ScalingConfig(num_workers=2), datasets=datasets)
    return {type(c).__name__ for c in trainer._create_default_callbacks()}


def test_the_trainer_leaves_out_the_callbacks_raytrain_does_without(monkeypatch):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    monkeypatch.delenv("RAYTRAIN_PG_CLEANER", raising=False)
    names = _default_callback_names()
    assert "DatasetsCallback" not in names  # no datasets: no DatasetManager actor, no Ray Data context sent
    assert {"BackendSetupCallback", "PlacementGroupCleanerCallback"} <= names, names
    monkeypatch.setenv("RAYTRAIN_PG_CLEANER", "0")  # what the local target sets
    assert "PlacementGroupCleanerCallback" not in _default_callback_names()
    import ray.data

    assert "DatasetsCallback" in _default_callback_names({"train": ray.data.range(4)})  # given datasets: kept
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert {"DatasetsCallback", "PlacementGroupCleanerCallback"} <= _default_callback_names()


def test_the_local_target_turns_the_placement_group_cleaner_off():
    from raytrain.targets.base import LOCAL_RUNTIME_ENV_VARS, RUNTIME_ENV_VARS

    assert LOCAL_RUNTIME_ENV_VARS["RAYTRAIN_PG_CLEANER"] == "0" and "RAYTRAIN_PG_CLEANER" not in RUNTIME_ENV_VARS


def test_the_local_target_runs_fixed_size_jobs_without_the_autoscaling_coordinator(monkeypatch):
    """The policy makes the fixed policy's decisions and never calls the coordinator (no Ray here: the real
    policy would create the detached actor); it pickles for the controller actor; elastic runs keep theirs."""
    from ray import cloudpickle
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy import ResizeDecision, create_scaling_policy

    from raytrain.targets.base import LOCAL_RUNTIME_ENV_VARS, RUNTIME_ENV_VARS

    assert LOCAL_RUNTIME_ENV_VARS["RAYTRAIN_AUTOSCALING_COORDINATOR"] == "0"
    assert "RAYTRAIN_AUTOSCALING_COORDINATOR" not in RUNTIME_ENV_VARS
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
    trainer = torch_backend.trainer(lambda config: None, backend_config_args={"timeout_s": 60.0, "interface": None},
                                    scaling_config=ScalingConfig(num_workers=2))
    monkeypatch.setenv("RAYTRAIN_AUTOSCALING_COORDINATOR", "0")
    trainer._initialize_and_run_controller(scaling_policy=fixed)
    assert type(seen["scaling_policy"]).__name__ == "FixedScalingPolicyWithoutCoordinator"
    monkeypatch.setenv("RAYTRAIN_AUTOSCALING_COORDINATOR", "1")
    trainer._initialize_and_run_controller(scaling_policy=fixed)
    assert seen["scaling_policy"] is fixed
