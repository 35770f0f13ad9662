"""The driver starts Ray Train's processes ahead (runtime.prestart): the runtime envs it replays must be the ones
Ray gives the controller and the workers, else the processes it starts are never used. The e2e submit test
checks the whole path (a job's workers run in processes started before its trainer existed); these check the
pieces against Ray's own code where Ray has it in Python."""
from __future__ import annotations

import json

import pytest

from raytrain.ray_tuning import prestart
from raytrain.runtime.worker import early_imports

JOB = {"env_vars": {"RAY_ADDRESS": "127.0.0.1:6379", "RAYTRAIN_PLAN": "{\"a\": 1}"}, "working_dir": "gcs://pkg.zip"}


def test_a_child_env_is_the_parents_with_its_own_keys_over_it_and_env_vars_merged():
    child = {"env_vars": {"FOO": "1", "RAY_ADDRESS": "other"}, "working_dir": "gcs://mine.zip", "pip": ["x"]}
    assert prestart.merge(JOB, child) == {
        "env_vars": {"RAY_ADDRESS": "other", "RAYTRAIN_PLAN": "{\"a\": 1}", "FOO": "1"},
        "working_dir": "gcs://mine.zip", "pip": ["x"]}
    assert prestart.merge({}, child) == child and prestart.merge(JOB, {}) == JOB
    assert JOB["env_vars"]["RAY_ADDRESS"] == "127.0.0.1:6379"  # the parent is not changed


def test_the_serialised_env_is_compact_json_with_sorted_keys_as_the_core_worker_dumps_it():
    text = prestart.serialize({"z": {"b": "é", "a": "x\"y"}, "a": "1"})
    assert text == '{"a":"1","z":{"a":"x\\"y","b":"é"}}'
    assert json.loads(text) == {"z": {"b": "é", "a": "x\"y"}, "a": "1"}


def test_the_controller_and_the_workers_envs_carry_what_ray_train_passes_them():
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR as warn

    propagated = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    controller = prestart.controller_env(JOB, propagated)
    assert controller["env_vars"] == {**JOB["env_vars"], **propagated, warn: "0"}
    assert controller["working_dir"] == "gcs://pkg.zip"
    workers = early_imports.worker_runtime_env(["torch", "deepspeed"], use_gpu=False)
    env = prestart.worker_env(JOB, propagated, workers)
    assert env["env_vars"] == {**controller["env_vars"], **workers["env_vars"]}
    assert env["env_vars"]["__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"] == early_imports.HOOK
    # a value the user set for Ray Train's variable is kept, not replaced by Train's default
    assert prestart.controller_env(JOB, {warn: "1"})["env_vars"][warn] == "1"


def test_the_worker_env_replays_ray_trains_own_worker_group_merge(monkeypatch):
    """Ray Train builds the workers' runtime env with ``WorkerGroup._get_worker_runtime_env`` (in the controller,
    whose os.environ has the controller's env vars); the replay must give the same dict."""
    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

    controller = prestart.controller_env(JOB, {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"})
    for key, value in controller["env_vars"].items():  # what the controller process sees
        monkeypatch.setenv(key, value)
    workers = early_imports.worker_runtime_env(["torch"], use_gpu=False)
    ray_child = WorkerGroup._get_worker_runtime_env(custom_runtime_env=workers)
    assert prestart.merge(controller, ray_child) == prestart.worker_env(
        JOB, {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}, workers)


def test_the_propagated_env_vars_are_ray_trains_without_importing_it(monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.7")
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    monkeypatch.setenv("NOT_A_TRAIN_VARIABLE", "x")
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    assert prestart.propagated_env_vars() == get_env_vars_to_propagate()
    assert prestart.propagated_env_vars()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.7"
    assert "NOT_A_TRAIN_VARIABLE" not in prestart.propagated_env_vars()


@pytest.mark.parametrize("available, want", [
    ({"CPU": 2.0}, 2), ({"CPU": 1.5}, 1), ({"CPU": 8.0}, 2), ({}, 0), ({"CPU": 4.0, "GPU": 1.0}, 1),
])
def test_workers_are_started_ahead_only_as_far_as_the_free_resources_go(available, want):
    per_worker = {"CPU": 1.0, "GPU": 1.0} if "GPU" in available else {"CPU": 1.0}
    assert prestart.workers_that_fit(2, per_worker, available) == want
    assert prestart.workers_that_fit(3, {"CPU": 0.0}, {}) == 3  # a zero request holds nothing


def test_it_is_turned_off_with_raytrain_ray_tuning_off(monkeypatch):
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert not prestart.enabled()
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    assert prestart.enabled()
