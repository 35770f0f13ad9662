"""Start the job's Ray Train processes ahead: the controller's and the workers', while the driver still imports.

Without this, each process starts only when Ray Train asks for it: the driver imports Ray Train and builds the
trainer (about 1 s), then ``fit()`` creates the controller actor, whose new process boots and imports Ray
Train (about 1.5 s), then the controller creates the worker actors, whose new processes boot and only then
begin to import torch and DeepSpeed (raytrain.runtime.worker.early_imports). Three process starts one after the
other, about 3 s before a worker process exists.

The node's raylet can start processes for a job before any task asks for them (its ``PrestartWorkers`` RPC,
which Ray 2.60 does not expose to Python; the generated gRPC stub and Ray's own authenticated channel are
used here). A started process is handed to the first actor of the same job whose runtime environment
serialises to the same string, so the driver asks, right after ``ray.init``, for one process with the
controller's runtime environment and one per worker with the workers' (hook and imports included): the
workers import torch and DeepSpeed while the driver and the controller are still starting.

Ray decides the two environments: an actor's runtime env is its parent's with the actor's own keys put over
it (``env_vars`` merged key by key), serialised as compact JSON with sorted keys (the core worker's C++
``OverrideRuntimeEnv`` and nlohmann's ``dump()``). The controller's parent is the job (the driver); the
workers' parent is the controller. ``controller_env`` and ``worker_env`` replay that; an e2e test checks that
a job's workers run in the processes started here.

Only the driver's node is asked: the controller always runs there (Ray Train pins it to the driver's node);
the workers only when the cluster is that one node and it has the resources free now (else the processes
could wait unused). A process nobody takes is stopped by Ray when the job ends, or when its keep-alive ends
and the node has more idle processes than CPUs. A tuning (raytrain.ray_tuning): off with
``RAYTRAIN_RAY_TUNING=off`` and on a Ray it was not written for.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from raytrain import ray_tuning

# One process with the controller's runtime env. Ray Train's synchronisation actor has that env too, but a
# second one started here was left idle (0.7 s of CPU for nothing) whenever the controller's own request
# reached the raylet before the first had registered: Ray then starts a process for the request, and the
# spare that is left over serves the synchronisation actor anyway.
CONTROLLER_PROCESSES = 1
KEEP_ALIVE_S = 60  # how long Ray keeps a started process that no actor took yet
# Ray Train's default for the one variable its trainer sets on the controller (data_parallel_trainer.py)
WARN_BLOCKING_GET_DEFAULT = "0"


def enabled() -> bool:
    return ray_tuning.on("prestart")


def merge(parent: dict, child: dict) -> dict:
    """A child task's or actor's runtime env: the parent's, with the child's keys over it and the two
    ``env_vars`` merged (Ray's ``CoreWorker::OverrideRuntimeEnv``)."""
    out = dict(parent)
    for key, value in child.items():
        if key == "env_vars" and "env_vars" in out:
            out["env_vars"] = {**out["env_vars"], **value}
        else:
            out[key] = value
    return out


def serialize(env: dict) -> str:
    """The string Ray's core worker keeps (and hashes) for a merged runtime env: nlohmann JSON's ``dump()``,
    i.e. sorted keys, no spaces, UTF-8 left as is."""
    return json.dumps(env, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def controller_env(job_env: dict, propagated: dict[str, str]) -> dict:
    """The runtime env Ray Train's controller actor gets: the job's, with the env vars the trainer passes
    (``get_env_vars_to_propagate()`` and a default for RAY_WARN_BLOCKING_GET_INSIDE_ASYNC)."""
    return merge(job_env, {"env_vars": _controller_vars(propagated)})


def worker_env(job_env: dict, propagated: dict[str, str], worker_runtime_env: dict) -> dict:
    """The runtime env of each Ray Train worker actor: the controller's, with the worker group's own over it
    (the controller's propagated env vars, then ``RunConfig.worker_runtime_env``)."""
    child = dict(worker_runtime_env)
    child["env_vars"] = {**_controller_vars(propagated), **worker_runtime_env.get("env_vars", {})}
    return merge(controller_env(job_env, propagated), child)


def _controller_vars(propagated: dict[str, str]) -> dict[str, str]:
    # the controller's os.environ then has this variable too, so it propagates it on to the workers
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR as warn

    return {**propagated, warn: propagated.get(warn, WARN_BLOCKING_GET_DEFAULT)}


def propagated_env_vars() -> dict[str, str]:
    """Ray Train's ``get_env_vars_to_propagate()`` for this process, read from its constants module without
    importing the ``ray.train`` package (0.5 s of CPU the driver pays later, in parallel with the processes
    started here); the package's own function if the file cannot be loaded alone."""
    import ray

    path = Path(ray.__file__).parent / "train" / "v2" / "_internal" / "constants.py"
    try:
        spec = importlib.util.spec_from_file_location("raytrain._ray_train_constants", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - moved or changed in another Ray: pay the import instead
        from ray.train.v2._internal import constants as module
    return module.get_env_vars_to_propagate()


def workers_that_fit(num_workers: int, per_worker: dict[str, float], available: dict[str, float]) -> int:
    """How many of the job's workers the node's free resources hold now (at most ``num_workers``)."""
    fit = num_workers
    for name, amount in per_worker.items():
        if amount and amount > 0:
            fit = min(fit, int(float(available.get(name, 0.0)) // float(amount)))
    return max(fit, 0)


def request(runtime_env: dict, num: int):
    """The PrestartWorkersRequest for ``num`` Python processes of this job with ``runtime_env`` (the job's
    runtime env info, i.e. its working_dir package and setup timeout, with the serialised env swapped in)."""
    import ray
    from ray.core.generated import common_pb2, node_manager_pb2

    core = ray._private.worker.global_worker.core_worker
    info = core.get_job_config().runtime_env_info
    info.serialized_runtime_env = serialize(runtime_env)
    return node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.Language.PYTHON,
        job_id=core.get_current_job_id().binary(),
        runtime_env_info=info,
        keep_alive_duration_secs=KEEP_ALIVE_S,
        num_workers=num,
    )


def job_runtime_env() -> dict:
    """This job's runtime env, as the driver's core worker holds it."""
    import ray

    text = ray._private.worker.global_worker.core_worker.get_current_runtime_env()
    return json.loads(text) if text and text.strip() not in ("", "{}") else {}


def start(num_workers: int, per_worker: dict[str, float], worker_runtime_env: dict, *,
          min_workers: int | None = None) -> dict[str, Any]:
    """Ask this node's raylet for the controller's process and, on a one-node cluster with room now for at
    least ``min_workers`` (default all), the workers'. Returns what was asked ({"controller": 0|1,
    "workers": n}); asks nothing when turned off or when the job's runtime env is empty (Ray then keeps the
    controller's env as Python serialised it, which this module does not replay)."""
    asked = {"controller": 0, "workers": 0}
    if not enabled():
        return asked
    job_env = job_runtime_env()
    if not job_env:
        return asked
    import ray
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2_grpc

    propagated = propagated_env_vars()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    workers = 0
    if len(alive) == 1:
        workers = workers_that_fit(num_workers, per_worker, ray.available_resources())
        if workers < (num_workers if min_workers is None else min_workers):
            workers = 0  # the job waits for resources: processes started now would idle
    node = ray._private.worker.global_worker.node
    channel = init_grpc_channel(f"{node.node_ip_address}:{node.node_manager_port}")
    try:
        stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        if workers:  # first: theirs are the long starts (torch, DeepSpeed)
            stub.PrestartWorkers(request(worker_env(job_env, propagated, worker_runtime_env), workers), timeout=5)
            asked["workers"] = workers
        stub.PrestartWorkers(request(controller_env(job_env, propagated), CONTROLLER_PROCESSES), timeout=5)
        asked["controller"] = CONTROLLER_PROCESSES
    finally:
        channel.close()
    return asked
