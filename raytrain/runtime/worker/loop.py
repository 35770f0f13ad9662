"""What every Ray Train worker runs: import the job file, build ``ctx``, call ``train(ctx)`` (or, in script
mode, run the file as ``__main__``: raytrain.runtime.worker.script)."""
from __future__ import annotations

from typing import Any

from raytrain.config.plan import Plan
from raytrain.runtime.worker.context import make_context
from raytrain.runtime.worker.job_import import load_job
from raytrain.runtime.worker.script import run_on_worker


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's loop on each worker; ``config`` is the driver's {"plan": the plan as a dict, "resume_from": ...}."""
    from raytrain.ray_tuning import prompt_poll
    from raytrain.runtime.worker import errors as worker_errors

    worker_errors.quiet_ray_train_errors()
    try:
        _train(config)
    except Exception as exc:  # its traceback once, from the job's own frames
        worker_errors.print_failure(exc, rank=_rank())
        raise
    else:  # after this rank's last line: the driver ends the job once it read it (runtime.driver.log_drain)
        _log_end()
    finally:  # returned or raised: the controller's next poll says so (raytrain.ray_tuning.prompt_poll)
        prompt_poll.ask()


def _log_end() -> None:
    import sys

    import ray.train

    from raytrain import events

    sys.stderr.flush()
    train_ctx = ray.train.get_context()
    events.emit(events.LOG_END, rank=train_ctx.get_world_rank(), world_size=train_ctx.get_world_size())


def _rank() -> int | None:
    try:
        import ray.train

        return ray.train.get_context().get_world_rank()
    except Exception:  # noqa: BLE001 - outside a Ray Train worker
        return None


def plan_of(config: dict[str, Any]) -> Plan:
    """The plan: the driver's (redacted: raytrain.redact) with the user's values from ``$RAYTRAIN_PLAN``, which
    every process of the job inherits."""
    import json

    from raytrain import redact, settings

    shown = config["plan"]
    real = settings.raw("RAYTRAIN_PLAN")
    return Plan.from_dict(redact.restore(shown, json.loads(real)) if real else shown)


def _train(config: dict[str, Any]) -> None:
    plan = plan_of(config)
    import warnings

    import ray.train

    from raytrain import run_record, timings

    train_ctx = ray.train.get_context()
    rank = train_ctx.get_world_rank()
    run_record.start(plan.storage, config.get("run", ""), f"rank-{rank}")
    from raytrain.runtime.worker import rank_log

    rank_log.start(run_record.record_dir(plan.storage, config.get("run", "")), rank, ray.util.get_node_ip_address())
    timings.emit("worker_process", timings.process_start_time(), rank=rank)
    timings.emit("train_fn", rank=rank)

    # DeepSpeed's ZeRO calls torch.distributed APIs that torch 2.13 deprecates, once per step: noise the
    # user cannot act on.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    from raytrain.runtime.worker import early_imports

    early_imports.prepare_environment(plan.scaling.use_gpu)
    if plan.scaling.use_gpu:  # the NCCL flight recorder's dumps land in the run's record (raytrain.flight_recorder)
        import os

        from raytrain import flight_recorder

        flight_recorder.prepare(os.environ)
    imported_at = early_imports.wait()  # torch and deepspeed may be importing since the process started
    if imported_at is not None:
        timings.emit("early_imports", imported_at, rank=rank)
    with early_imports.collector_paused():  # what the process holds from here on lives as long as it
        import torch  # noqa: F401

        early_imports.match_torch_threads()
        from raytrain.runtime.worker.deepspeed_imports import import_deepspeed

        import_deepspeed()  # what every job needs; timed on its own

    from raytrain.runtime.worker import heartbeat

    # where this rank is, every few seconds, its stacks on request (hang watchdog), its compute time per step
    # (straggler watch); --hang-timeout 0 turns the driver's watchdog, and so the timing, off
    heartbeat.start(rank, time_compute=plan.hang_timeout_s != 0)
    from raytrain.runtime.worker import preemption

    preemption.start_watch()  # a drain of this node, or a Kubernetes preStop's notice file: a preemption notice
    from raytrain.runtime.worker import core_binding

    cores = core_binding.bind_worker(train_ctx.get_local_rank(), train_ctx.get_local_world_size(),
                                     plan.scaling.resources_per_worker.get("CPU", 1), plan.scaling.use_gpu)
    timings.emit("imports", rank=rank, **({"cores": cores} if cores else {}))
    if plan.mode == "script":  # an unmodified deepspeed/torchrun script, run as __main__
        return run_on_worker(plan, restore_point(config, plan) if plan.hf_trainer else None)
    module = load_job(plan.job_module)
    ctx = make_context(plan, restore_from=restore_point(config, plan), run_name=config.get("run", ""))
    try:
        module.train(ctx)
    except BaseException:
        if ctx._reporter.trackers is not None:  # the steps reported so far reach the trackers
            ctx._reporter.trackers.flush(timeout_s=30.0)
        raise
    ctx.finish()


def restore_point(config: dict[str, Any], plan: Any = None) -> str | None:
    """The checkpoint to continue from: Ray Train's latest (after a worker-group restart) or --resume's, or a
    newer complete one in this run's folder that Ray Train never registered (see ``unregistered_newer``)."""
    import ray.train

    rank0 = ray.train.get_context().get_world_rank() == 0
    checkpoint = ray.train.get_checkpoint()
    newer = unregistered_newer(plan, config.get("run", ""), checkpoint.path if checkpoint is not None else None)
    if rank0:
        remove_uncommitted(plan, config.get("run", ""))
    if newer is not None:
        if rank0:
            print(f"raytrain: continuing from {newer.path} (step {newer.step}): complete on storage, newer than "
                  "the checkpoint Ray Train registered", flush=True)
        return newer.path
    if checkpoint is None:
        return config.get("resume_from")
    if type(checkpoint.filesystem).__name__ == "LocalFileSystem":
        return checkpoint.path
    return checkpoint.to_directory()  # remote storage (s3://, gs://): download this worker's copy


def remove_uncommitted(plan: Any, run_name: str) -> None:
    """With ``--keep``, rank 0 deletes the run's uncommitted checkpoint folders (a save a failure interrupted)
    as each attempt starts, one line each: Ray Train's retention counts only the checkpoints it registered, so
    on a run restarted for days they would pile up. Here no save is in flight: the attempt before has ended and
    no rank of this one has saved (the ranks build the engine together after this). Where the storage is a
    path; on a URI (s3://, gs://) they stay (``raytrain jobs checkpoints RUN --all`` lists them)."""
    from raytrain import run_record
    from raytrain.checkpoints import store

    folder = run_record.run_folder(getattr(plan, "storage", None), run_name)
    if not getattr(plan, "keep", None) or folder is None:
        return
    for info in store.remove_uncommitted(folder):
        step = f"step {info.step}, " if info.step is not None else ""
        print(f"raytrain: --keep {plan.keep}: removed the uncommitted checkpoint {info.path} ({step}{info.reason}, "
              f"{info.size_bytes / 1e6:.1f} MB)", flush=True)


def unregistered_newer(plan: Any, run_name: str, registered: str | None):
    """The newest complete checkpoint in this run's folder when it is newer than ``registered`` (Ray Train's
    latest, None: none): a worker's report reaches Ray Train's controller only at the controller's next poll
    of it, so a group that died in between (a worker killed right after a save) restarts without that
    checkpoint, though every rank's files and marker are on storage. The run's folder holds only this job's
    checkpoints (its name is the submission id). None where the storage is not a path (a URI, Ray's default)."""
    from raytrain import run_record
    from raytrain.checkpoints import marker as markers
    from raytrain.checkpoints import store

    folder = run_record.run_folder(getattr(plan, "storage", None), run_name)
    if folder is None:
        return None
    saved = markers.read_or_none(registered) if registered else None
    above = saved.step if saved is not None else None
    return store.latest_complete(folder, above_step=above)
