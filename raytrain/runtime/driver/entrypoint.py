"""The Ray job entrypoint: ``python -m raytrain.runtime.driver.entrypoint``, run by the cluster for each submission.

Reads the plan from ``$RAYTRAIN_PLAN``, checks the cluster can hold it, resolves ``--resume``, runs Ray
Train's TorchTrainer and prints events (see raytrain.events) that the CLI follows. Exit status: 0 done,
1 training failed, 3 the plan cannot run on this cluster (capacity, resume point).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field

from raytrain import events, redact, settings, timings
from raytrain.capacity import Node, capacity_problem
from raytrain.config.plan import Plan
from raytrain.events import emit
from raytrain.runtime.worker.errors import lost_a_peer

EXIT_TRAINING_FAILED = 1
EXIT_CANNOT_RUN = 3
# Ray Train logs every report at INFO and raytrain shows progress itself: its warnings and errors only.
TRAIN_LOG_LEVEL = "WARNING"


def cluster_nodes() -> list[Node]:
    import ray

    return [
        Node(
            node_id=n["NodeID"],
            address=n.get("NodeManagerAddress", ""),
            resources=dict(n.get("Resources") or {}),
            alive=bool(n.get("Alive")),
            hostname=n.get("NodeManagerHostname", ""),
        )
        for n in ray.nodes()
    ]


def failing_rank(failures: dict) -> int:
    """The rank whose failure caused the others: the lowest rank that did not merely lose a peer."""
    own = [rank for rank in sorted(failures) if lost_a_peer(failures[rank]) is None]
    return own[0] if own else min(failures)


def _root_cause(exc: BaseException) -> tuple[BaseException, int | None]:
    """The user's exception inside Ray Train's wrappers, and the rank that raised it (if known)."""
    rank = None
    failures = getattr(exc, "worker_failures", None)
    if failures:
        rank = failing_rank(failures)
        exc = failures[rank]
    elif isinstance(getattr(exc, "controller_failure", None), BaseException):
        exc = exc.controller_failure
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(nxt, BaseException):
            break
        exc = nxt
    return exc, rank


# Ray's paragraph for an actor whose process died: its exit type and detail are what say why
_PROCESS_DIED = re.compile(r"worker process has died\. Worker exit type: (\S+) Worker exit detail: (.*?)"
                           r"(?: Some common causes|$)", re.S)


def _process_died(exc: BaseException) -> str | None:
    """``its worker process died (TYPE: detail)`` from Ray's paragraph, or None for any other error."""
    died = _PROCESS_DIED.search(str(exc))
    return f"its worker process died ({died.group(1)}: {' '.join(died.group(2).split())})"[:500] if died else None


def _one_line(exc: BaseException) -> str:
    died = _process_died(exc)
    if died:
        return died
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:500]


def _restart_reason(cause: BaseException, rank: int) -> str:
    died = _process_died(cause)
    return f"rank {rank}: {died}" if died else f"rank {rank}: {type(cause).__name__}: {_one_line(cause)}"


def restart_announcer(max_failures: int):
    """A Ray Train callback (runs in the controller) that announces each worker-group restart."""
    from ray.train import UserCallback

    class AnnounceRestarts(UserCallback):
        def __init__(self):
            self.failures = 0
            self.seen: set = set()

        def after_exception(self, run_context, worker_exceptions):
            from raytrain.runtime.worker import rollback

            key = frozenset((rank, repr(exc)[:300]) for rank, exc in worker_exceptions.items())
            if key in self.seen:
                return
            if rollback.group_kind(type("E", (), {"worker_failures": worker_exceptions})()):
                return  # rank 0 said it (a rollback event), and it counts toward --max-rollbacks, not failures
            self.seen.add(key)
            self.failures += 1
            rank = failing_rank(worker_exceptions)
            cause, _ = _root_cause(worker_exceptions[rank])
            if max_failures < 0 or self.failures <= max_failures:
                emit(
                    events.RESTARTING,
                    attempt=self.failures + 1,
                    rank=rank,
                    reason=_restart_reason(cause, rank),
                    time=round(time.time(), 3),
                )

    return AnnounceRestarts()


def rollback_policy(plan: Plan):
    """Ray Train's failure policy with rollbacks (runtime.worker.rollback) when --rollback-after is on."""
    import contextlib

    from raytrain.runtime.worker import rollback

    return rollback.installed(plan.max_rollbacks) if plan.rollback_after > 0 else contextlib.nullcontext()


def load_datasets(plan: Plan) -> tuple[dict, str | None]:
    """Start streaming every ``--data`` dataset (read + the job's ``preprocess(dataset, ctx)``, run by Ray Data
    from a Feeder actor: raytrain.runtime.datasets.feed) and wait until each has one global micro-batch of rows
    (all its rows when its transforms could not run beside the training workers): {name: Feeder handle}
    (keep it: the feed lives as long as the handle), or the one-line reason the data cannot be used."""
    if not plan.data:
        return {}, None
    import ray

    from raytrain.runtime.datasets import feed as data_feed, source as data_source

    preprocess = None
    if plan.mode == "train":
        from raytrain.runtime.worker.job_import import load_job

        import ray.cloudpickle

        module = load_job(plan.job_module)
        # Ray Data's tasks cannot import the job file's module (``raytrain_job``): ship its functions by value.
        ray.cloudpickle.register_pickle_by_value(module)
        preprocess = getattr(module, "preprocess", None)
    # CPUs free beside the training workers (not the cluster's totals: another job may hold some); none ->
    # the read and the transforms ask for 0 and stream beside the workers
    spare = data_source.spare_cpus(ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0),
                                   plan.scaling.total().get("CPU", 0))
    try:
        datasets = data_source.build(plan, preprocess, {} if spare >= 1 else {"num_cpus": 0})
    except data_source.DataError as exc:
        return {}, str(exc)
    feeders, streaming, task_cpus = {}, {}, {}
    for spec in plan.data:
        name = spec["name"]
        task_cpus[name] = data_source.cpus_per_task(datasets[name])
        streaming[name] = task_cpus[name] <= max(spare, 0.0)
        feeders[name] = data_feed.start_feeder(datasets[name], name, f"--data {name}={redact.text(spec['path'])}",
                                               float(plan.data_timeout_s))
    dp, micro = int(plan.parallel["dp"]), int(plan.deepspeed["train_micro_batch_size_per_gpu"])
    for spec in plan.data:
        name = spec["name"]
        need = dp * micro if streaming[name] else float("inf")  # a transform that needs a CPU: all rows first
        while True:
            try:  # a feed answers within its poll (progress() waits at most that long): past the bound it is gone
                rows, done, error = ray.get(feeders[name].progress.remote(need), timeout=data_feed.CALL_TIMEOUT_S)
                if not done and rows < need:
                    continue
                _, feed_ip = ray.get(feeders[name].node.remote(), timeout=data_feed.CALL_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                return {}, (f"--data {name}={redact.text(spec['path'])}: the data feed did not answer within "
                            f"{data_feed.CALL_TIMEOUT_S:.0f} s")
            except ray.exceptions.RayError as exc:  # the feeder's process died (out of memory, ...), or could
                # not be placed on this node
                return {}, f"--data {name}={redact.text(spec['path'])}: the data feed failed: {data_source.first_line(exc)}"
            break
        problem = data_source.check_rows(f"--data {name}={redact.text(spec['path'])}", rows, done, error, dp, micro)
        if problem:
            return {}, problem
        emit(events.DATASET, name=name, rows=rows if done else None, rows_ready=rows, streaming=streaming[name],
             preprocess=preprocess is not None, task_cpus=task_cpus[name], spare_cpus=max(spare, 0.0),
             feed_ip=feed_ip)
    timings.emit("data_ready")
    return feeders, None


def worker_imports(plan: Plan) -> list[str]:
    """What the workers import in the background from their start: torch, DeepSpeed, and transformers for a
    job that uses it (the Trainer, or a job file that imports it)."""
    modules = ["torch", "deepspeed"]
    uses_hf = plan.hf_trainer
    if not uses_hf:
        import re

        from raytrain.runtime.worker.job_import import find_job_file

        try:
            text = find_job_file(plan.job_module).read_text(errors="replace")
        except OSError:
            text = ""
        uses_hf = re.search(r"^\s*(import|from)\s+transformers\b", text, re.MULTILINE) is not None
    return modules + (["transformers"] if uses_hf else [])


def prestart_processes(plan: Plan, worker_env: dict) -> None:
    """Have the node start Ray Train's controller and worker processes now (raytrain.ray_tuning.prestart): they
    boot, and the workers import torch and DeepSpeed, while this driver imports Ray Train and loads data. A
    failure here costs only the head start."""
    from raytrain.ray_tuning import prestart

    scaling = plan.scaling
    try:
        asked = prestart.start(scaling.num_workers, scaling.resources_per_worker, worker_env,
                               min_workers=scaling.min_workers if scaling.elastic else scaling.num_workers)
    except Exception as exc:  # noqa: BLE001 - the processes start later, as Ray would start them
        if settings.get("RAYTRAIN_VERBOSE"):
            print(f"raytrain: could not start the job's processes ahead: {exc}", file=sys.stderr)
        return
    if asked["controller"] or asked["workers"]:
        timings.emit("prestart", **asked)


def read_plan() -> Plan:
    """The plan the CLI resolved, from ``$RAYTRAIN_PLAN`` (missing fields take the Plan's defaults)."""
    return Plan.from_dict(json.loads(settings.raw("RAYTRAIN_PLAN")))


def _pinned_address() -> dict | None:
    """The job's actors get the cluster address the driver was given. Ray Train's PlacementGroupCleaner
    otherwise looks the cluster up by "auto", which fails on a machine running two Ray clusters ("Found
    multiple active Ray instances"): its thread dies and a stopped job's placement group can leak."""
    address = os.environ.get("RAY_ADDRESS")
    return {"env_vars": {"RAY_ADDRESS": address}} if address else None


def clean_leaked() -> None:
    """Remove the placement groups ended jobs leaked (they would hold this job's CPUs/GPUs for ever)."""
    from raytrain.runtime.driver import placement_watch

    try:
        removed = placement_watch.remove_leaked()
    except Exception as exc:  # the state API did not answer: the watch still reports a wait
        print(f"raytrain: could not look for leaked placement groups: {exc}", file=sys.stderr)
        removed = []
    if removed:
        emit(events.CLEANED, groups=removed)


def watch_placement(plan: Plan):
    """Remove leaked placement groups (two state API calls, from a thread: this job's group is placed as soon
    as they are gone, and the start waits for nothing when there are none), then watch this job's groups
    until ``fit()`` returns: a ``waiting`` event says what the workers wait for and who holds it; after
    ``--start-timeout`` the driver gives up (exit 1)."""
    import threading

    import ray

    from raytrain.runtime.driver import placement_watch

    threading.Thread(target=clean_leaked, name="raytrain-clean-leaked", daemon=True).start()
    job_id = ray.get_runtime_context().get_job_id()
    timeout_s = float(plan.start_timeout_s)
    watch = placement_watch.StartWatch(
        job_id, timeout_s, lambda message: placement_watch.give_up(job_id, timeout_s, message)
    )
    watch.start()
    return watch


def end_trackers(plan: Plan, run_name: str, outcome: str) -> None:
    """--track's runs end as the raytrain run did ("failed", "stopped"): never left running."""
    if plan.track:
        from raytrain import run_record
        from raytrain.runtime.tracking import trackers

        trackers.end_runs(plan, run_record.record_dir(plan.storage, run_name), outcome, run_name=run_name,
                          log=lambda line: print(line, file=sys.stderr))


BOARD: list = []  # the job's board (raytrain.runtime.driver.hang_watch), once made: a SIGTERM tells the workers through it
STOPPING: list = []  # the thread that ends the job after a SIGTERM, once one came
# How long a SIGTERM'd driver waits for the workers' checkpoint of the step in progress before it ends the job
# anyway (`jobs stop` gives it RAY_JOB_STOP_WAIT_TIME_S, 3 s unless the cluster was started with more)
STOP_GRACE_S = 60.0
STOP_POLL_S = 0.25


def record_when_stopped(plan: Plan, run_name: str) -> None:
    """A SIGTERM to this process (`jobs stop`, a cluster that stops, a pod evicted, a plain kill) ends the job,
    losing at most the step in progress. At once: the job's last word, a ``stopped`` event (the run's record then
    says how the job ended even if a SIGKILL follows: Ray's job stop sends one RAY_JOB_STOP_WAIT_TIME_S later),
    every rank's preemption notice through the job's board, --track's runs ended as stopped (within 2.5 s).
    Then, on a thread, the workers save the step in progress (raytrain.runtime.worker.preemption) and tell the
    board; once it is committed (or after STOP_GRACE_S) a second ``stopped`` event names the checkpoint, and the
    process ends as Ray's own handler does. A second SIGTERM ends it at once. MLflow's client is made ready
    ahead, in the background, so that a stop only has the call to make."""
    import signal
    import threading

    from raytrain import run_record
    from raytrain.runtime.tracking import trackers

    ends_trackers = bool(set(plan.track) & set(trackers.ENDERS))
    if "mlflow" in plan.track:
        record_dir = run_record.record_dir(plan.storage, run_name)
        threading.Thread(target=trackers.warm_up, args=(record_dir,), kwargs={"plan": plan}, daemon=True,
                         name="raytrain-mlflow").start()
    previous = signal.getsignal(signal.SIGTERM)

    def on_stop(signum, frame):
        if STOPPING:  # the stopping thread is done, or a second SIGTERM: the sender means it
            if callable(previous):
                previous(signum, frame)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        say_stopped(signal="SIGTERM")
        for board in BOARD:  # every rank's preemption notice at its next beat
            try:
                board.preempt.remote("driver SIGTERM", time.time() + STOP_GRACE_S)
            except Exception:  # noqa: BLE001
                pass
        ender = None
        if ends_trackers:
            ender = threading.Thread(target=end_trackers, args=(plan, run_name, "stopped"), daemon=True)
            ender.start()
        stopping = threading.Thread(target=end_after_stop, args=(run_name, ender), daemon=True,
                                    name="raytrain-stop")
        STOPPING.append(stopping)
        stopping.start()

    signal.signal(signal.SIGTERM, on_stop)


def say_stopped(**fields) -> None:
    """The driver's ``stopped`` event, also from a signal handler."""
    try:
        emit(events.STOPPED, **fields)
    except Exception:  # noqa: BLE001 (stdout gone, or mid-write in this very thread: a buffered stream is
        try:  # not reentrant; the record has the event already): the line straight to the fd
            os.write(1, (events.format_event(events.STOPPED, **fields) + "\n").encode())
        except OSError:  # the stop itself must go on
            pass


def end_after_stop(run_name: str, ender) -> None:
    """The stopping thread (record_when_stopped): wait for the workers' checkpoint, say which, then SIGTERM this
    process again (its handler then ends it)."""
    import signal

    import ray

    deadline = time.time() + STOP_GRACE_S
    outcome = None
    for board in BOARD:
        while time.time() < deadline:
            try:
                state = ray.get(board.preempt_state.remote(), timeout=5)
            except Exception:  # noqa: BLE001 (a board that is gone: nothing will answer)
                break
            if state["outcome"] is not None or not state["ranks"]:  # answered, or no worker trains yet
                outcome = state["outcome"]
                break
            time.sleep(STOP_POLL_S)
    fields = {"signal": "SIGTERM"}
    if outcome and outcome.get("saved"):
        fields.update(checkpoint_step=outcome["step"], message=(
            f"stopped (SIGTERM): the checkpoint of step {outcome['step']} is committed; "
            f"`raytrain submit ... --resume {run_name}` continues after it"))
    elif BOARD:
        fields.update(message=("stopped (SIGTERM): no checkpoint of the step in progress"
                               + (f" (step {outcome['step']}: refused)" if outcome else
                                  f" within {STOP_GRACE_S:g} s") + "; `--resume` continues from the last "
                               "committed one"))
    if len(fields) > 1:
        say_stopped(**fields)
    if ender is not None:
        ender.join(timeout=2.5)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def watch_hangs(plan: Plan, run_name: str):
    """The job's board (heartbeats, `jobs stack`) and its hang watchdog; ``--on-hang fail`` (and ``report``
    past the collective timeout) ends the job here: its error event says where every rank was."""
    from raytrain.runtime.driver import hang_watch

    def fail(reason: str) -> None:
        emit(events.ERROR, type="Hang", rank=None, message=reason)
        end_trackers(plan, run_name, "failed")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_TRAINING_FAILED)  # fit() is blocked on the hung workers; they end with this driver's job

    try:
        return hang_watch.start_watchdog(plan, fail)
    except Exception as exc:  # noqa: BLE001 (no board: training goes on without heartbeats)
        print(f"raytrain: no hang watchdog: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None, None


@dataclass(frozen=True)
class Outcome:
    """How the driver ends: its last word (an event, which the CLI and the run's record read) and its exit
    status. ``ends_trackers``: how --track's runs end with it ("failed"), None where none has started."""

    event: str
    fields: dict
    exit_code: int
    ends_trackers: str | None = None


def cannot_run(event: str, message: str) -> Outcome:
    """The plan cannot run on this cluster (capacity, storage, resume point, workers that cannot connect)."""
    return Outcome(event, {"message": message}, EXIT_CANNOT_RUN)


def training_failed(kind: str, message: str, rank: int | None = None) -> Outcome:
    return Outcome(events.ERROR, {"type": kind, "rank": rank, "message": message}, EXIT_TRAINING_FAILED, "failed")


@dataclass
class Job:
    """What the phases learn, in order; each phase returns None to go on or the job's Outcome."""

    plan: Plan
    run_name: str
    storage_nodes: int | None = None  # how many nodes were shown to share --storage (None: not checked)
    resume_from: str | None = None
    worker_env: dict = field(default_factory=dict)
    feeders: dict = field(default_factory=dict)  # held until fit() returns: the workers read from them
    driver_ip: str | None = None  # the node this driver runs on (the head; None: not looked up)


def connect() -> Job:
    """Read the plan, start the run's record and connect to the cluster."""
    from raytrain import run_record, timings
    from raytrain.ray_tuning import prompt_poll

    plan = read_plan()
    prompt_poll.configure_driver_env()  # before Ray Train's controller env is derived (prestart, fit)
    run_name = settings.get("RAYTRAIN_RUN_NAME") or plan.name
    run_record.start(plan.storage, run_name, "driver")  # the run's events outlive the cluster
    for phase, t in timings.from_env().items():  # the client's marks (command, request built, submitted)
        timings.emit(phase, t)
    timings.emit("driver_started", timings.process_start_time())
    import ray

    import logging

    # Ray's "Connecting to existing Ray cluster ..." lines only with `submit -v`.
    quiet = not settings.get("RAYTRAIN_VERBOSE")
    from raytrain.runtime.driver import log_drain

    log_drain.install()  # before Ray's thread that prints the workers' lines starts
    ray.init(log_to_driver=True, runtime_env=_pinned_address(), logging_level=logging.WARNING if quiet else logging.INFO)
    return Job(plan, run_name)


def check_driver_node(job: Job) -> Outcome | None:
    """The driver should run on the head node: its loss (and that of the actors pinned beside it, the data feeds
    and the board) ends the job, where a lost worker node only restarts its workers (runtime.driver.head). Off
    the head is the cluster owner's choice (a Ray setting), so it is a warning, not a refusal."""
    from raytrain.runtime.driver import head

    nodes = cluster_nodes()
    here = head.this_node()
    job.driver_ip = next((n.address for n in nodes if n.node_id == here), None)
    if sum(n.alive for n in nodes) < 2:  # one node: it is the head (no state API call on the way to step 1)
        return None
    try:
        seen = head.list_nodes()
    except Exception as exc:  # noqa: BLE001 - the state API did not answer: the actors are still pinned here
        print(f"raytrain: could not check that the driver runs on the head node: {exc}", file=sys.stderr)
        return None
    problem = head.driver_node_problem(here, seen)
    if problem:
        print(f"raytrain: warning: {problem}", file=sys.stderr, flush=True)
    return None


def check_capacity(job: Job) -> Outcome | None:
    scaling = job.plan.scaling
    problem = capacity_problem(
        scaling.num_workers, scaling.resources_per_worker, cluster_nodes(), scaling.min_workers
    )
    return cannot_run(events.CAPACITY, problem) if problem else None


def check_storage(job: Job) -> Outcome | None:
    """A --storage path must be one folder every node shares (a URI is the storage system's to check)."""
    storage = job.plan.storage
    if not storage:
        return None
    from raytrain.storage import is_uri, probe_visibility, storage_problem

    if is_uri(storage):
        return None
    visibility = probe_visibility(storage, f".raytrain-storage-check-{job.run_name}")
    job.storage_nodes = len(visibility)
    problem = storage_problem(storage, visibility)
    return cannot_run(events.INVALID, problem) if problem else None


def resolve_resume(job: Job) -> Outcome | None:
    plan = job.plan
    if not plan.resume:
        return None
    from raytrain import run_record
    from raytrain.checkpoints.store import resolve_resume as resolve
    from raytrain.errors import ConfigError

    try:
        job.resume_from = resolve(plan.resume, plan.storage).path
        run_record.inherit_trackers(job.resume_from, plan.storage, job.run_name, plan.mlflow_uri)  # the same runs
    except ConfigError as exc:  # no such checkpoint: the plan cannot run
        return classify_failure(exc)
    return None


def load_data(job: Job) -> Outcome | None:
    """Start the workers' processes ahead, then stream the datasets while they boot."""
    from raytrain.runtime.worker import early_imports

    plan, scaling = job.plan, job.plan.scaling
    job.worker_env = early_imports.worker_runtime_env(
        worker_imports(plan), scaling.use_gpu, scaling.resources_per_worker.get("CPU"), plan.env)
    prestart_processes(plan, job.worker_env)
    job.feeders, problem = load_datasets(plan)
    return Outcome(events.ERROR, {"type": "DataError", "rank": None, "message": problem},
                   EXIT_TRAINING_FAILED) if problem else None


def build_trainer(job: Job):
    """Ray Train's trainer with raytrain's backend; announces the start (the ``started`` event)."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    from raytrain.runtime.driver import trainer as torch_backend
    from raytrain.runtime.worker.loop import train_loop_per_worker

    plan, scaling, run_name = job.plan, job.plan.scaling, job.run_name
    emit(
        events.STARTED,
        name=plan.name,
        run=run_name,
        storage=plan.storage,
        storage_nodes=job.storage_nodes,
        workers=scaling.workers_label if scaling.elastic else scaling.num_workers,
        use_gpu=scaling.use_gpu,
        zero=plan.zero,
        precision=plan.precision,
        train_batch=plan.train_batch,
        tp=plan.parallel["tp"],
        pp=plan.parallel["pp"],
        resume_from=job.resume_from,
        checkpoint_mode=job.plan.checkpoint_mode,
        driver_ip=job.driver_ip,
    )
    return torch_backend.trainer(
        train_loop_per_worker,
        # redacted: Ray Train keeps and shows its train_loop_config; the workers restore the user's values
        # from $RAYTRAIN_PLAN, which they inherit (raytrain.runtime.worker.loop)
        train_loop_config={"plan": redact.plan_dict(plan.to_dict()), "resume_from": job.resume_from, "run": run_name},
        backend_config_args={"timeout_s": float(plan.timeout_s), "interface": plan.interface},
        local_cluster=plan.local_cluster,
        scaling_config=ScalingConfig(
            num_workers=(scaling.min_workers, scaling.num_workers) if scaling.elastic else scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=scaling.resources_per_worker,
            placement_strategy=scaling.placement_strategy,
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=plan.storage or None,
            failure_config=FailureConfig(max_failures=plan.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=plan.keep or None),
            callbacks=[restart_announcer(plan.max_failures)],
            logging_config=LoggingConfig(log_level=TRAIN_LOG_LEVEL),
            worker_runtime_env=job.worker_env,
        ),
    )


def fit(job: Job) -> Outcome:
    """Train, watched (placement, SIGTERM, hangs): ``finished`` with the final metrics, or the failure's outcome."""
    from raytrain.ray_tuning import prompt_poll

    trainer = build_trainer(job)
    timings.emit("driver_ready")  # the trainer (and the torch import Ray's TorchTrainer makes) included
    watch = watch_placement(job.plan)
    record_when_stopped(job.plan, job.run_name)
    board, dog = watch_hangs(job.plan, job.run_name)  # noqa: F841 (the board lives as long as this handle)
    if board is not None:
        BOARD.append(board)
    try:
        with prompt_poll.installed(), rollback_policy(job.plan):  # the controller polls the workers when they ask
            result = trainer.fit()
    except Exception as exc:  # TrainingFailedError and friends: report the cause in one line
        wait_for_stop()
        return classify_failure(exc, dog.summary if dog is not None else None)
    finally:
        watch.stopped.set()
        if dog is not None:
            dog.stopped.set()
    wait_for_stop()
    from raytrain.runtime.driver import log_drain

    log_drain.wait()
    checkpoint = getattr(result, "checkpoint", None)
    return Outcome(events.FINISHED, {"time": round(time.time(), 3), "metrics": result.metrics, "path": getattr(result, "path", None),
                                     "checkpoint": getattr(checkpoint, "path", None)}, 0)


def wait_for_stop() -> None:
    """After a SIGTERM the stopping thread ends the job (record_when_stopped): the training's own end, meanwhile,
    is not the job's."""
    for stopping in STOPPING:
        stopping.join(timeout=STOP_GRACE_S + 10)


def classify_failure(exc: BaseException, hang_summary: list[str] | None = None) -> Outcome:
    """The one place a failure becomes an outcome, by the type of its root cause: a setup the plan cannot run
    with (workers that cannot connect, a resume point that is not there) exits 3 with an ``invalid`` event;
    any other exception is the training's failure (exit 1), named by its type and the rank that raised it.
    ``hang_summary``: where every rank was when a reported hang ended in this failure."""
    from raytrain.errors import ConfigError
    from raytrain.runtime.driver.preflight import PreflightError

    if isinstance(exc, ConfigError):  # raytrain's own refusal (e.g. --resume): its message, whatever caused it
        return cannot_run(events.INVALID, str(exc))
    cause, rank = _root_cause(exc)
    if isinstance(cause, (PreflightError, ConfigError)):
        return cannot_run(events.INVALID, str(cause))
    if rank is None or settings.get("RAYTRAIN_VERBOSE"):  # a worker's: it printed it (runtime.worker.errors)
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    message = _one_line(cause)
    if hang_summary:  # a reported hang ended in this failure (e.g. the collective timeout)
        message = f"{message}; after a hang: {'; '.join(hang_summary)}"
    from raytrain.runtime.worker.errors import shipped_traceback

    failures = getattr(exc, "worker_failures", None) or {}
    # the failing rank's traceback as the worker sent it: its log may not have reached the storage yet
    shipped = shipped_traceback(failures[rank]) if rank in failures else None
    outcome = training_failed(type(cause).__name__, message, rank)
    if shipped:
        outcome.fields["traceback"] = shipped
    return outcome


def finish(job: Job, outcome: Outcome) -> int:
    """The driver's last word, then --track's runs end as the job did."""
    emit(outcome.event, **outcome.fields)
    if outcome.ends_trackers:
        end_trackers(job.plan, job.run_name, outcome.ends_trackers)
    return outcome.exit_code


PHASES = (check_driver_node, check_capacity, check_storage, resolve_resume, load_data, fit)


def main() -> int:
    job = connect()
    for phase in PHASES:
        outcome = phase(job)
        if outcome is not None:
            break
    return finish(job, outcome)


def run_from_job_code() -> int:
    """``main()`` in the job's copy of its folder when the local target made one instead of an upload (as in
    an unpacked working_dir, the driver's cwd is the job's folder), removed when the driver ends."""
    code = settings.get("RAYTRAIN_JOB_CODE")
    if not code:
        return main()
    os.chdir(code)
    try:
        return main()
    finally:
        os.chdir("/")
        import shutil

        shutil.rmtree(code, ignore_errors=True)


if __name__ == "__main__":
    from raytrain.runtime.driver.process_exit import exit_without_finalizing

    exit_without_finalizing(run_from_job_code())
