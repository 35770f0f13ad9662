"""The library API the CLI is a thin layer over. Usable from Python::

    from raytrain.api import Options, dry_run, submit, wait
    handle = submit(Options(job="jobs/cnn.py", workers=2, zero=1, precision="bf16"))
    info = wait(handle)
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Container

from raytrain import run_record
from raytrain.capacity import capacity_problem, tensor_group_problem
from raytrain.config import Options, Plan, resolve
from raytrain.errors import ClusterError, JobFailed
from raytrain.events import CAPACITY, INVALID, JobFacts
from raytrain.status import JobInfo, JobState
from raytrain.targets.base import JobHandle, Request, Target
from raytrain.targets.factory import TargetOptions, make_target


def plan(options: Options, target: Target | None = None) -> tuple[Target, Plan]:
    target = target or make_target(TargetOptions(address=options.address))
    # A read-only look at the cluster (or, for a local cluster not yet started, at this machine).
    has_gpus = target.has_gpus() if options.gpus_per_worker is None else False
    the_plan = resolve(options, cluster_has_gpus=has_gpus)
    check_tensor_split(the_plan)
    return target, the_plan


def _defines_model(path: str) -> bool:
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    return any(isinstance(n, ast.FunctionDef) and n.name == "model" for n in tree.body)


def check_tensor_split(the_plan: Plan) -> None:
    """With --tp > 1 and a job that defines ``model(args)``, check the split on the meta device before
    submitting (no memory, no download): a model AutoTP cannot split, or a --tp that does not divide a
    layer, is refused naming the layers. Jobs without ``model(args)`` are checked on the workers."""
    tp = the_plan.parallel["tp"]
    if tp <= 1 or not _defines_model(the_plan.job_file):
        return
    from raytrain.errors import ConfigError
    from raytrain.planner.meta import build_on_meta, load_model_function
    from raytrain.planner.partition import PartitionError, check_tp, choose_spec

    fn = load_model_function(the_plan.job_file)
    module = build_on_meta(fn, the_plan.job_args)
    configured = the_plan.deepspeed.get("tensor_parallel", {}).get("partition_config")
    spec = choose_spec(configured, fn.__globals__.get("TP_SPEC"))
    try:
        check_tp(module, spec, tp)
    except PartitionError as exc:
        raise ConfigError(str(exc), flag="--tp") from exc


def dry_run(options: Options, target: Target | None = None) -> tuple[Target, Request]:
    """The exact request a submit would send. No side effects."""
    from raytrain import timings

    target, the_plan = plan(options, target)
    request = target.dry_run(the_plan)
    check_here(target, request.plan)
    timings.mark("request_built")
    return target, request


def check_capacity(target: Target, the_plan: Plan, request: Request | None = None) -> None:
    """Refuse, before submitting, a request the cluster can never hold (with ``request``: the cluster that
    request runs on, e.g. the one a RayJob brings)."""
    nodes = target.nodes(request)
    scaling = the_plan.scaling
    problem = capacity_problem(scaling.num_workers, scaling.resources_per_worker, nodes, scaling.min_workers)
    problem = problem or tensor_group_problem(
        the_plan.parallel["tp"], the_plan.scaling.resources_per_worker, nodes
    )
    if problem:
        raise ClusterError(problem)


def recovery_flags(the_plan: Plan) -> list[str]:
    """The flags of ``the_plan`` that only work when its checkpoints outlive a node (and a RayJob's cluster)."""
    flags = []
    if the_plan.checkpoint_every:
        flags.append(f"--checkpoint-every {the_plan.checkpoint_every}")
    if the_plan.max_failures:
        flags.append(f"--max-failures {the_plan.max_failures}")
    if the_plan.scaling.elastic:
        flags.append(f"--workers {the_plan.scaling.workers_label}")
    return flags


def check_recovery_storage(target: Target, the_plan: Plan) -> None:
    """A run that checkpoints, restarts or resizes on a remote cluster with no --storage (and no storage of
    the cluster's or profile's) would write its checkpoints to Ray's default folder on one node (a RayJob's
    cluster is deleted after the job): they would be lost. Refused before submitting (the dry run too)."""
    flags = recovery_flags(the_plan)
    if not flags or target.storage_is_local or the_plan.storage:
        return
    from raytrain.errors import ConfigError

    raise ConfigError(
        f"{', '.join(flags)} on {target.address} with no --storage: the checkpoints would go to Ray's default "
        "folder on one node's disk (a RayJob's cluster is deleted after the job), where a restart, resize or "
        "--resume cannot find them; give --storage with a path every node mounts (NFS, a ReadWriteMany PVC) "
        "or a URI such as s3://bucket/runs",
        flag="--storage",
    )


def check_here(target: Target, the_plan: Plan) -> None:
    """The checks that need no cluster, run by the dry run and the submit alike: recovery needs shared storage
    off this machine (check_recovery_storage). Where the run's storage is
    on this machine (the local cluster): --storage must be writable and --resume must name a complete
    checkpoint (the driver checks --resume again on the cluster, where it also covers remote clusters)."""
    check_recovery_storage(target, the_plan)
    if not target.storage_is_local:
        return
    from raytrain.errors import ConfigError
    from raytrain.storage import local_storage_problem

    problem = local_storage_problem(the_plan.storage)
    if problem:
        raise ConfigError(problem, flag="--storage")
    if the_plan.resume:
        from raytrain.checkpoints.store import resolve_resume

        found = resolve_resume(the_plan.resume, the_plan.storage)
        if the_plan.hf_trainer:
            check_trainer_batch(found.path, the_plan)


def check_trainer_batch(checkpoint: str, the_plan: Plan) -> None:
    """A Trainer checkpoint resumed on another number of workers must keep its global batch (the Trainer
    counts its data position in steps): refused here, before submitting, as the workers would refuse it."""
    from raytrain.checkpoints import hf_content
    from raytrain.errors import ConfigError

    refused = hf_content.trainer_batch_refusal(
        hf_content.saved_trainer_batch(checkpoint), checkpoint, micro=the_plan.micro_batch,
        grad_accum=the_plan.grad_accum, world_size=the_plan.scaling.num_workers,
    )
    if refused:
        raise ConfigError(f"--resume {the_plan.resume}: {refused[1]}", flag=refused[0])


def submit_request(target: Target, request: Request) -> JobHandle:
    check_here(target, request.plan)
    target.ensure_running()
    if target.nodes_without_connecting:  # refused before a port-forward is opened
        check_capacity(target, request.plan, request)
    for line in target.check_versions():  # before a capacity read of the cluster: a Ray it cannot run on
        print(f"raytrain: {line}", file=sys.stderr)  # is named as such, not as a failing request
    if not target.nodes_without_connecting:
        check_capacity(target, request.plan, request)
    handle = target.submit(_with_client_timings(request))
    run_record.remember(handle.job_id, request.plan.storage)
    return handle


def _with_client_timings(request: Request) -> Request:
    """A copy of the request whose env carries this process's start-up marks to the driver (they become
    timing events in the job's log; the dry run shows the request without them)."""
    import copy

    from raytrain import timings

    timings.mark("submitted")
    out = copy.copy(request)
    out.runtime_env = {**request.runtime_env,
                       "env_vars": {**(request.runtime_env.get("env_vars") or {}), **timings.client_env()}}
    return out


def submit(options: Options, target: Target | None = None) -> JobHandle:
    target, request = dry_run(options, target)
    return submit_request(target, request)


def wait(
    handle: JobHandle, target: Target | None = None, on_text: Callable[[str], None] | None = None,
    storage: str | None = None, shown: Container[str] | None = None,
) -> JobInfo:
    """Follow the job's log until it ends; the final JobInfo (with facts). Raises JobFailed on failure (with
    the failing rank's last lines where the run's ``storage`` keeps them, unless ``shown``, the lines
    ``on_text`` showed, already holds them)."""
    target = target or make_target(TargetOptions(address=handle.address if handle.target != "local" else None))
    target.follow(handle.job_id, on_text or (lambda _text: None))
    info = with_recorded_steps(target.status(handle.job_id), storage)
    if info.facts and info.facts.error and info.facts.error.get("event") in (CAPACITY, INVALID):
        raise ClusterError(info.facts.error.get("message", "the cluster cannot run this job"))
    if info.state is not JobState.SUCCEEDED:
        raise JobFailed(failure_message(info) + failing_rank_tail(info, storage, shown=shown))
    return info


def status(job_id: str, target: Target | None = None, storage: str | None = None) -> JobInfo:
    """Job ``job_id`` as the cluster reports it, refined by its log; where the cluster does not know it (a
    local cluster restarted or stopped since, a deleted RayJob), as the run's record in ``storage`` (or where
    this machine noted it at submit time, or the default storage) tells it. Raises the cluster's
    ClusterError where there is no record either."""
    target = target or make_target(TargetOptions(), auto_start=False)
    try:
        return with_recorded_steps(target.status(job_id), storage)
    except ClusterError as exc:
        folder = record_of(job_id, storage)
        if folder is None:
            if not target.running():  # nothing to ask: say where the record was looked for
                raise no_record(job_id, storage) from None
            raise
        return run_record.job_info(job_id, folder, why=str(exc))


def with_recorded_steps(info: JobInfo, storage: str | None = None) -> JobInfo:
    """``info`` of an ended job, with the facts of its run's record where that has steps its log lacks: Ray
    streams a worker's output into the job's log asynchronously, so a job that ends right after its last
    report can end before those lines arrive; each process wrote them to the record itself."""
    if not info.state.terminal:
        return info
    folder = record_of(info.job_id, storage)
    if folder is None:
        return info
    seen = ((info.facts.last_metrics if info.facts else None) or {}).get("step")
    last = run_record.last_step(folder)
    if seen is not None and last is not None and last <= seen:
        return info  # the log has the record's last step: no need to read the whole record
    recorded = JobFacts.from_lines(run_record.read_lines(folder))
    kept = (recorded.last_metrics or {}).get("step")
    if kept is not None and (seen is None or kept > seen):
        info.facts = recorded
    return info


def no_record(job_id: str, storage: str | None) -> ClusterError:
    """What `jobs status` and `jobs metrics|plot` say for a job with no record while its cluster is not
    running: where the record was looked for, and what to give instead."""
    from raytrain import paths

    return ClusterError(
        f"{job_id}: no record of it in {storage or paths.default_storage()} and the cluster is not running; give "
        "the run's --storage if it used another"
    )


def record_of(job_id: str, storage: str | None = None) -> Path | None:
    """The folder of run ``job_id``'s record: in ``storage``, where this machine noted it at submit time, or
    in the default storage; None where there is none."""
    from raytrain import paths

    return run_record.find(job_id, [storage, str(paths.default_storage())])


def jobs(target: Target | None = None) -> list[JobInfo]:
    """Every raytrain job on the cluster, newest first. For the local cluster (whose runs are recorded in this
    machine's default storage) also the runs it no longer knows, as their records tell them: the jobs of
    earlier cluster instances, and all of them while it is stopped."""
    target = target or make_target(TargetOptions(), auto_start=False)
    infos = target.list() if target.running() else []
    if target.storage_is_local:
        known = {i.job_id for i in infos}
        infos += [run_record.job_info(name, folder, steps=False)
                  for name, folder in run_record.runs_in(target.default_storage()) if name not in known]
    return sorted(infos, key=lambda i: i.start_time or 0, reverse=True)


def failing_rank_tail(info: JobInfo, storage: str | None, lines: int = 15, shown: Container[str] | None = None) -> str:
    """The failing rank's last lines of output, from the run's record; where that copy lacks the rank's error
    (its copier, a process of its own, may not have caught up: raytrain.runtime.worker.rank_log), the traceback the
    worker sent with its failure; "" when there is neither. Only where to find them when every one of them is
    in ``shown`` (the lines a follow already printed, without Ray's ``(pid=..)`` prefix), so that a traceback
    is not printed twice."""

    error = (info.facts or JobFacts()).error or {}
    if error.get("rank") is None:
        return ""
    rank = error["rank"]
    folder = run_record.find(info.job_id, [storage])
    path = run_record.rank_logs(folder).get(int(rank)) if folder is not None else None
    from raytrain.log_filter import LogFilter

    last = run_record.tail(path, lines, keep=LogFilter(color=False)) if path is not None else []  # no Ray chatter
    sent = [line for line in str(error.get("traceback") or "").rstrip().splitlines() if line.strip()]
    everything = f"raytrain jobs logs {info.job_id} --rank {rank}"
    if sent and sent[-1].strip() not in {line.strip() for line in last}:  # the copy is behind the error
        if shown is not None and all(line.rstrip() in shown for line in sent):
            return f"\n(its output is above; all of rank {rank}'s: {everything})"
        return (f"\nrank {rank}'s traceback (all of its output, once its log has reached the storage: {everything}):\n"
                + "\n".join(f"  {line}" for line in sent))
    if last and shown is not None and all(not line.strip() or line.rstrip() in shown for line in last):
        return f"\n(its output is above; all of rank {rank}'s: {everything})"
    return (f"\nlast lines of rank {rank} (all: {everything}):\n"
            + "\n".join(f"  {line}" for line in last)) if last else ""


def failure_message(info: JobInfo) -> str:
    error = (info.facts or JobFacts()).error
    if error:
        where = f" on rank {error['rank']}" if error.get("rank") is not None else ""
        return f"job {info.job_id} {info.state}{where}: {error.get('type', 'Error')}: {error.get('message', '')}"
    return f"job {info.job_id} {info.state}: {info.message or 'no message from the cluster'}"


__all__ = ["Options", "check_capacity", "dry_run", "jobs", "plan", "record_of", "status", "submit", "submit_request", "wait"]
