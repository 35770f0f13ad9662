"""What each Ray tuning (raytrain.ray_tuning) relies on, checked against the installed Ray: a Ray release that
renames, moves or reshapes any of it fails here, naming the tuning, instead of leaving the tuning silently
broken. Also: the version gate and the one switch that turn the tunings off.

The contracts run on the Ray a tuning was written for; on any other Ray the tuning turns itself off, and so
its contract is skipped (the product then runs on stock Ray, which the e2e smoke subset checks).
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from importlib import import_module

import pytest

from raytrain import ray_tuning
from raytrain.ray_tuning import TUNINGS


def params(func) -> set[str]:
    return set(inspect.signature(func).parameters)


def attr(path: str):
    """The object at ``module.attr.attr`` (the longest importable module prefix)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _head_processes():
    from ray._private import ray_constants, services

    assert {"command", "process_type"} <= params(services.start_ray_process)
    assert ray_constants.PROCESS_TYPE_DASHBOARD == "dashboard" and ray_constants.PROCESS_TYPE_RAYLET == "raylet"


def dashboard_modules():
    _head_processes()
    from ray.dashboard.subprocesses.module import SubprocessModule
    from ray.dashboard.utils import DashboardHeadModule, get_all_modules

    from raytrain.ray_tuning.ray_start import DASHBOARD_MODULES

    available = {c.__name__ for kind in (DashboardHeadModule, SubprocessModule) for c in get_all_modules(kind)}
    assert set(DASHBOARD_MODULES) <= available, set(DASHBOARD_MODULES) - available
    assert "--modules-to-load" in inspect.getsource(attr("ray.dashboard.dashboard"))


def no_ray_client():
    node = attr("ray._private.node.Node")
    assert params(node.start_ray_client_server) == {"self"}
    assert "start_ray_client_server" in inspect.getsource(node)


def raylet_flags():
    _head_processes()
    source = inspect.getsource(attr("ray._private.services.start_raylet"))
    from raytrain.ray_tuning.ray_start import PRESTART_FLAG, STARTUP_FLAG, WORKER_COMMAND_FLAG

    for flag in (STARTUP_FLAG, WORKER_COMMAND_FLAG):
        assert flag in source, flag
    assert PRESTART_FLAG.rstrip("=") in source


def light_setup_worker():
    raylet_flags()
    import ray

    from raytrain.ray_tuning.ray_setup_worker import KNOWN_FIELDS
    from raytrain.ray_tuning.ray_start import RAY_SETUP_WORKER

    assert os.path.isfile(os.path.join(os.path.dirname(ray.__file__), RAY_SETUP_WORKER))
    context = attr("ray._private.runtime_env.context.RuntimeEnvContext")
    assert set(context().__dict__) == KNOWN_FIELDS, set(context().__dict__) ^ KNOWN_FIELDS
    assert "bash" in inspect.getsource(context.exec_worker)


def quiet_dashboard():
    from ray.dashboard.subprocesses import handle, module

    for mod, method in ((handle, handle.SubprocessModuleHandle._do_periodic_health_check),
                        (module, module.SubprocessModule._detect_parent_process_death)):
        assert inspect.getsource(mod).count("asyncio.sleep(") == 1 and "asyncio.sleep(1)" in inspect.getsource(method)
    assert hasattr(handle.SubprocessModuleHandle, "preload_in_forkserver") and hasattr(handle, "asyncio")
    from raytrain.ray_tuning.ray_dashboard import dashboard_script

    assert os.path.isfile(dashboard_script())


def prestart():
    import ray
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    fields = set(node_manager_pb2.PrestartWorkersRequest.DESCRIPTOR.fields_by_name)
    assert {"language", "job_id", "runtime_env_info", "keep_alive_duration_secs", "num_workers"} <= fields
    assert "PrestartWorkers" in inspect.getsource(node_manager_pb2_grpc.NodeManagerServiceStub)
    assert callable(attr("ray._private.grpc_utils.init_grpc_channel"))
    assert attr("ray._common.constants.RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR")
    core = attr("ray._raylet.CoreWorker")
    for name in ("get_current_runtime_env", "get_job_config", "get_current_job_id"):
        assert hasattr(core, name), name
    worker = attr("ray._private.worker")
    assert "core_worker" in inspect.getsource(worker.Worker) and hasattr(worker, "global_worker")
    assert {"node_ip_address", "node_manager_port"} <= {n for n, _ in inspect.getmembers(attr("ray._private.node.Node"))}
    constants = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "constants.py")
    assert "def get_env_vars_to_propagate" in open(constants, encoding="utf-8").read()


def prompt_poll():
    controller = attr("ray.train.v2._internal.execution.controller.TrainController")
    poll = controller._poll_workers
    assert inspect.iscoroutinefunction(poll) and params(poll) == {"self"}
    source = inspect.getsource(controller)
    for name in ("_health_check_interval_s", "_latest_poll_time", "_worker_group", "poll_status"):
        assert name in source, name
    assert hasattr(controller, "get_state")
    assert attr("ray.train.v2.api.data_parallel_trainer").TrainController is controller
    assert callable(attr("ray.train.v2._internal.util.time_monotonic"))
    context = attr("ray.train.v2._internal.execution.context")
    assert "controller_actor" in inspect.getsource(context.TrainContext) and callable(context.get_train_context)


def early_imports():
    from raytrain.ray_tuning.early_imports import setup_hook_env_var

    assert setup_hook_env_var() == "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
    assert "worker_process_setup_hook" in inspect.getsource(attr("ray._private.worker"))


def lazy_torch():
    from raytrain.ray_tuning.lazy_torch import HELPERS, RAY_TORCH, torch_framework

    config = import_module(RAY_TORCH)
    for name in HELPERS:
        assert callable(getattr(config, name, None)), f"{RAY_TORCH}.{name}"
    assert {"backend", "world_rank", "world_size", "init_method", "timeout_s"} <= params(
        config._setup_torch_process_group)
    assert "destroy_process_group" in params(config._shutdown_torch)
    assert torch_framework() is not None and torch_framework().value == "torch"
    from ray.train.backend import Backend, BackendConfig

    assert {"on_start", "on_shutdown"} <= set(vars(Backend)) and "framework" in vars(BackendConfig)


def lean_trainer():
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    assert params(DataParallelTrainer._create_default_callbacks) == {"self"}
    assert "controller_init_kwargs" in params(DataParallelTrainer._initialize_and_run_controller)
    source = inspect.getsource(DataParallelTrainer)
    for name in ("DatasetsCallback", "PlacementGroupCleanerCallback", "scaling_policy"):
        assert name in source, name
    fixed = attr("ray.train.v2._internal.execution.scaling_policy.fixed.FixedScalingPolicy")
    assert params(fixed._maybe_send_resource_request) == {"self"}
    assert "train_run_context" in params(fixed.after_controller_start)
    assert "_requester_id" in inspect.getsource(attr(
        "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"))


def elastic_fresh_view():
    elastic = attr("ray.train.v2._internal.execution.scaling_policy.elastic.ElasticScalingPolicy")
    assert params(elastic.make_decision_for_non_running_worker_group) == {"self"}
    assert params(elastic._maybe_send_resource_request) == {"self"}
    assert params(elastic._count_possible_workers) == {"self", "reserved_resources"}
    assert "_count_possible_workers" in inspect.getsource(elastic.make_decision_for_non_running_worker_group)
    assert elastic.GET_RESERVED_RESOURCES_INTERVAL_S > 0
    source = inspect.getsource(elastic._get_reserved_resources)
    for name in ("_latest_reserved_resources_query_time", "_latest_reserved_resources", "_autoscaling_coordinator",
                 "GET_RESERVED_RESOURCES_INTERVAL_S"):
        assert name in source, name  # the cached answer the tuning sets is what the base class returns
    coordinator = attr("ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator")
    assert {"requester_id", "recompute"} <= params(coordinator._AutoscalingCoordinatorActor.get_reserved_resources)
    assert attr("ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"
                ".AUTOSCALING_REQUESTS_GET_TIMEOUT_S") > 0
    assert callable(attr("ray.train.v2._internal.util.time_monotonic"))


def report_barrier():
    context = attr("ray.train.v2._internal.execution.context")
    assert callable(context.get_train_context) and params(context.TrainContext.get_result_queue) == {"self"}
    assert "get_nowait" in inspect.getsource(attr("ray.train.v2._internal.execution.worker_group.worker"))


CONTRACTS = {f.__name__: f for f in (dashboard_modules, no_ray_client, raylet_flags, light_setup_worker,
                                     quiet_dashboard, prestart, prompt_poll, early_imports, lazy_torch,
                                     lean_trainer, elastic_fresh_view, report_barrier)}


def test_every_tuning_has_a_contract():
    assert set(CONTRACTS) == set(TUNINGS)


@pytest.mark.parametrize("name", sorted(TUNINGS))
def test_what_the_tuning_relies_on_is_still_in_the_installed_ray(name, monkeypatch):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    reason = ray_tuning.off_reason(name)
    if reason is not None:
        pytest.skip(f"Ray tuning {name} is off here ({reason}): nothing of Ray's is relied on")
    try:
        CONTRACTS[name]()
    except Exception as exc:  # noqa: BLE001 - any change (moved, renamed, reshaped) fails naming the tuning
        pytest.fail(f"Ray tuning {name!r} ({TUNINGS[name].what}): the installed Ray {ray_tuning.ray_version()} "
                    f"changed what it relies on: {type(exc).__name__}: {exc}. Fix raytrain/ray_tuning/"
                    f"{TUNINGS[name].module}.py or take this Ray out of its gate.")


def test_the_necessary_accesses_still_exist():
    from raytrain.ray_tuning import ray_access

    # preemption notices from a node drain; async checkpoints' report indices; rollbacks' failure policy
    state = attr("ray._private.state")
    assert callable(getattr(state.state, "get_draining_nodes", None)), "preemption: GCS draining nodes"
    context = attr("ray.train.v2._internal.execution.context")
    assert callable(getattr(context, "get_train_context", None)), "async checkpoints: Ray Train's train context"
    for field_name in ("report_call_index", "current_report_index"):
        assert field_name in inspect.getsource(context), f"async checkpoints: TrainContext.{field_name}"
    assert callable(getattr(attr("ray.train.v2.api.data_parallel_trainer"), "create_failure_policy", None)), \
        "rollback: Ray Train's failure-policy factory"
    policy = attr("ray.train.v2._internal.execution.failure_handling")
    assert hasattr(policy, "DefaultFailurePolicy") and hasattr(policy.FailureDecision, "RETRY"), "rollback policy"

    assert ray_access.ray_train_error_logger() == ray_access.RAY_TRAIN_ERROR_LOGGER
    assert "Error in training function" in inspect.getsource(attr(ray_access.RAY_TRAIN_ERROR_LOGGER))
    for name in ray_access.NOISY_CLIENT_LOGGERS:
        import_module(name)  # a logger named after its module
    from ray.data import Dataset

    assert hasattr(Dataset, "iter_internal_ref_bundles")


def test_a_tuning_turns_itself_off_on_another_ray_with_one_line(monkeypatch, capsys):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    monkeypatch.setattr(ray_tuning, "_said", set())
    for version in ("2.59.1", "2.61.0", "3.0.0", ""):
        assert ray_tuning.off_reason("prestart", version=version) is not None
    assert ray_tuning.off_reason("prestart", version="2.60.3") is None
    monkeypatch.setattr(ray_tuning, "ray_version", lambda: "2.58.0")
    assert not ray_tuning.on("prestart") and not ray_tuning.on("prestart")
    assert not ray_tuning.on("prompt_poll", say=False)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["raytrain: Ray tuning prestart is off: written for Ray 2.60.x, this is Ray 2.58.0 (stock Ray's "
                     "behaviour; docs/ray-tuning.md)"]


def test_the_switch_turns_every_tuning_off_without_a_word(monkeypatch, capsys):
    monkeypatch.setattr(ray_tuning, "_said", set())
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert not any(ray_tuning.on(name) for name in TUNINGS)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "on")
    monkeypatch.setattr(ray_tuning, "ray_version", lambda: "2.60.0")
    assert all(ray_tuning.on(name) for name in TUNINGS)


def test_the_switch_reaches_the_job_from_the_submitting_shell(monkeypatch):
    from raytrain.errors import ConfigError
    from raytrain.targets.base import tuning_env_vars

    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    assert tuning_env_vars() == {}
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "OFF")
    assert tuning_env_vars() == {"RAYTRAIN_RAY_TUNING": "off"}
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "no")
    with pytest.raises(ConfigError, match="RAYTRAIN_RAY_TUNING=no"):
        tuning_env_vars()


def test_with_the_tunings_off_nothing_of_rays_private_modules_is_patched(tmp_path):
    """The head's ``ray start`` and the driver's trainer under RAYTRAIN_RAY_TUNING=off: Ray's own process start,
    Node and trainer classes, untouched."""
    code = (
        "import sys\n"
        "from ray._private import services\n"
        "from ray._private.node import Node\n"
        "before = (services.start_ray_process, Node.start_ray_client_server)\n"
        "from raytrain.ray_tuning import ray_start\n"
        "from raytrain.runtime.driver import trainer as torch_backend\n"
        "from ray.train import ScalingConfig\n"
        "ray_start.start_head_processes_quietly(ray_start.modules_to_load(), False, ray_start.startup_concurrency())\n"
        "assert not ray_start.ray_client_wanted() is False\n"
        "t = torch_backend.trainer(lambda c: None, backend_config_args={'timeout_s': 1, 'interface': None},\n"
        "                          scaling_config=ScalingConfig(num_workers=1))\n"
        "assert (services.start_ray_process, Node.start_ray_client_server) == before\n"
        "print(type(t).__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAYTRAIN_RAY_TUNING": "off", "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["TorchTrainer", "True"]
