"""``--track tensorboard|mlflow|wandb``: rank 0 logs every ``ctx.report``, every worker's peak memory, the
resolved DeepSpeed config and flags (as params) and a final summary to each tracker, through its own library
(imported only here, only when asked for).

One tracker run per raytrain run: ``<storage>/<run>/raytrain/trackers.json`` keeps each tracker's run id and
the last step it logged, so a restart after a worker failure, an elastic resize or a ``--resume`` (whose state
the driver copies from the run it continues) appends to the same tracker run and never logs a step twice.
Starting and logging happen on background threads, one per tracker: a report costs the step a queue put, and
a tracker that cannot be reached is dropped after a bound (``START_TIMEOUT_S``, ``CALL_TIMEOUT_S``,
``MAX_FAILURES``) with a ``tracker`` event, while training goes on."""
from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

STATE_FILE = "trackers.json"
MEMORY_EVERY_S = 10.0
SKIP_KEYS = ("step", "event", "wall_time", "total_steps")


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``a.b.c`` keys (lists as JSON text): params every tracker accepts."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flat(value, f"{prefix}{key}."))
    elif isinstance(data, (list, tuple)):
        out[prefix[:-1]] = json.dumps(data, default=str)
    else:
        out[prefix[:-1]] = data
    return out


def plan_params(plan: Any) -> dict[str, Any]:
    """The flags (the plan's scalar fields) and the exact DeepSpeed config, as params: redacted
    (raytrain.redact: --mlflow-uri, --data, secret-named keys), the job's arguments only with --track-args."""
    from raytrain import redact

    d = redact.plan_dict(plan.to_dict())
    if not getattr(plan, "track_args", False):
        d.pop("job_args", None)
    params = {f"raytrain.{k}": v for k, v in flat({k: v for k, v in d.items() if k != "deepspeed"}).items()}
    params.update({f"deepspeed.{k}": v for k, v in flat(d["deepspeed"]).items()})
    return {k: ("" if v is None else v) for k, v in params.items()}


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in metrics.items()
        if k not in SKIP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def resumed_run_dirs(plan: Any) -> list[Path]:
    """The folder of the run --resume continues (where its tracker files are), as the plan names it."""
    import os

    if not getattr(plan, "resume", None):
        return []
    candidates = [Path(plan.resume).expanduser()]
    if plan.storage and not os.path.isabs(plan.resume):
        candidates.append(Path(plan.storage).expanduser() / plan.resume)
    found = []
    for p in candidates:  # a run folder (it has a record), or a checkpoint folder in one
        if (p / "raytrain").is_dir():
            found.append(p)
        elif p.is_dir() and (p.parent / "raytrain").is_dir():
            found.append(p.parent)
    return found


class State:
    """The trackers' run ids and last logged steps, kept in the run's record folder."""

    def __init__(self, folder: Path | None):
        self.path = folder / STATE_FILE if folder is not None else None
        self.data: dict[str, dict] = {}
        if self.path is not None and self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except ValueError:
                self.data = {}

    def of(self, name: str) -> dict:
        return self.data.setdefault(name, {})

    def trust(self, plan: Any, run_dir: Path, log=print) -> None:
        """Keep only the entries raytrain.run_record.trusted_trackers accepts: under this run's folder (or the
        one --resume continues), the plan's own MLflow URI. Whoever can write the storage can write this file."""
        from raytrain.run_record import trusted_trackers

        self.data, dropped = trusted_trackers(self.data, [run_dir, *resumed_run_dirs(plan)], plan.mlflow_uri)
        for line in dropped:
            log(f"raytrain: {self.path}: not using {line}; starting that tracker afresh")

    def save(self) -> None:
        if self.path is not None:
            from raytrain import paths

            paths.private_mkdir(self.path.parent)
            paths.private_write(self.path, json.dumps(self.data, sort_keys=True))


class TensorBoard:
    name = "tensorboard"

    def __init__(self, state: dict, *, run_dir: Path, run_name: str, plan: Any, params: dict):
        from torch.utils.tensorboard import SummaryWriter

        from raytrain import redact

        restart = "dir" in state
        if not restart:
            from raytrain import paths

            paths.private_mkdir(run_dir / "tensorboard")
        state.setdefault("dir", str(run_dir / "tensorboard"))
        if restart:  # a step the event file took just before the worker died may be missing from the state
            state["last_step"] = max(state.get("last_step", 0), self.last_logged_step(Path(state["dir"])))
        self.writer = SummaryWriter(log_dir=state["dir"])
        if not state.get("params_logged"):
            self.writer.add_text("raytrain/params", "\n".join(f"    {k} = {v}" for k, v in sorted(params.items())))
            shown = redact.mapping(plan.deepspeed)
            self.writer.add_text("raytrain/deepspeed", "    " + json.dumps(shown, indent=2).replace("\n", "\n    "))
            state["params_logged"] = True

    @staticmethod
    def last_logged_step(folder: Path) -> int:
        """The highest step any scalar in the folder's event files holds (a torn last record ends a file)."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        last = 0
        for path in sorted(folder.glob("events.out.tfevents.*")):
            try:
                for event in EventFileLoader(str(path)).Load():
                    if event.HasField("summary") and any(v.HasField("simple_value") or v.HasField("tensor")
                                                         for v in event.summary.value
                                                         if v.metadata.plugin_data.plugin_name in ("", "scalars")):
                        last = max(last, int(event.step))
            except Exception:  # noqa: BLE001 - an unreadable file holds nothing we can count on
                continue
        return last

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def summary(self, summary: dict, step: int) -> None:
        self.writer.add_text("raytrain/summary", "    " + json.dumps(summary, indent=2).replace("\n", "\n    "), step)

    def close(self) -> None:
        self.writer.close()


class MLflow:
    name = "mlflow"

    def __init__(self, state: dict, *, run_dir: Path, run_name: str, plan: Any, params: dict):
        from mlflow.tracking import MlflowClient

        if not (plan.mlflow_uri or state.get("uri")):  # MLflow 3 keeps its file store read-only: SQLite
            from raytrain import paths

            paths.private_mkdir(run_dir / "mlflow")
        uri = plan.mlflow_uri or state.get("uri") or f"sqlite:///{(run_dir / 'mlflow' / 'mlflow.db').resolve()}"
        state["uri"] = uri
        self.client = MlflowClient(tracking_uri=uri)
        if not state.get("run_id"):
            experiment = self.client.get_experiment_by_name(plan.name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(plan.name)
            run = self.client.create_run(experiment_id, run_name=run_name, tags={"raytrain.run": run_name})
            state["run_id"] = run.info.run_id
        else:  # a restart: a step the server took just before the worker died may be missing from the state
            state["last_step"] = max(state.get("last_step", 0), self.last_logged_step(state["run_id"]))
        self.run_id = state["run_id"]
        if not state.get("params_logged"):
            from mlflow.entities import Param

            items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
            for i in range(0, len(items), 100):  # MLflow's batch limit
                self.client.log_batch(self.run_id, params=items[i:i + 100])
            state["params_logged"] = True
        self.client.update_run(self.run_id, status="RUNNING")

    def last_logged_step(self, run_id: str) -> int:
        """The highest step the run holds a value for (the tracking store's own record)."""
        keys = self.client.get_run(run_id).data.metrics
        return max((m.step for key in keys for m in self.client.get_metric_history(run_id, key)), default=0)

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def summary(self, summary: dict, step: int) -> None:
        for key, value in flat(summary).items():
            self.client.set_tag(self.run_id, f"summary.{key}", str(value))

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class WandB:
    name = "wandb"

    def __init__(self, state: dict, *, run_dir: Path, run_name: str, plan: Any, params: dict):
        import wandb

        import secrets

        state.setdefault("id", secrets.token_hex(4))
        from raytrain import paths

        folder = paths.private_mkdir(run_dir / "wandb")
        self.run = wandb.init(
            project=plan.name, name=run_name, id=state["id"], resume="allow", dir=str(folder), config=params,
            reinit="create_new",
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def summary(self, summary: dict, step: int) -> None:
        self.run.summary.update(flat(summary))

    def close(self) -> None:
        self.run.finish()


KINDS = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": WandB}


def peak_memory(record_dir: Path | None) -> dict[int, float]:
    """Every rank's peak memory (GPU, else RSS; bytes) from the run's record (all ranks write one)."""
    from raytrain import events

    peaks: dict[int, float] = {}
    if record_dir is None:
        return peaks
    for path in record_dir.glob("events-rank-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            event = events.parse_line(line)
            if event and event.get("event") == events.MEMORY:
                value = event.get("gpu_memory_peak") or event.get("rss_peak")
                if value:
                    rank = int(event.get("rank", 0))
                    peaks[rank] = max(peaks.get(rank, 0.0), float(value))
    return peaks


# Bounds on a tracker (rank 0 never waits for one longer): its start (import, connection, run creation), one
# call (a step's log, the summary, the close), and failed calls in a row. A tracker past one is dropped: a
# `tracker` event says why, training goes on without it. MLflow's own HTTP retries (7, backing off to minutes by
# default) are cut to a few seconds unless the job's environment sets them (`--env MLFLOW_HTTP_REQUEST_...`).
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 30.0
MAX_FAILURES = 3
WATCH_EVERY_S = 1.0
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def bound_mlflow_retries() -> None:
    import os

    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


class _Slot:
    """One tracker: its own thread (a tracker that hangs holds up no other) and queue; ``busy_since`` says
    since when its current call runs (None: idle), ``dead`` why it was dropped (None: alive)."""

    def __init__(self, name: str):
        self.name = name
        self.tracker: Any = None
        self.queue: queue.Queue = queue.Queue()
        self.busy_since: float | None = None
        self.busy_with = "start"
        self.failures = 0
        self.step = 0
        self.last_memory = 0.0
        self.dead: str | None = None
        self.thread: threading.Thread | None = None


class Trackers:
    """Rank 0's trackers. ``report(metrics)`` queues; each tracker's thread starts it, then logs each step once
    (steps at or below the last one logged, by this process or one before it, are skipped). The training
    thread never calls a tracker: a tracker whose start or call outlives its bound, or that fails
    ``MAX_FAILURES`` calls in a row, is dropped and reported. ``finish(summary)`` drains and closes."""

    def __init__(self, plan: Any, *, run_name: str, record_dir: Path | None, log=print):
        self.plan, self.run_name, self.record_dir, self.log = plan, run_name, record_dir, log
        self.state = State(record_dir)
        self._lock = threading.Lock()  # the state file, shared by the trackers' threads
        self._run_dir = record_dir.parent if record_dir is not None else Path.cwd()
        self.state.trust(plan, self._run_dir, log)  # trackers.json names only this run's own places
        self._params = plan_params(plan)
        self.slots = [_Slot(name) for name in plan.track]
        self._closing = threading.Event()
        for slot in self.slots:
            slot.busy_since = time.monotonic()  # starting
            slot.queue.put(("start", None))
            slot.thread = threading.Thread(target=self._run, args=(slot,), name=f"raytrain-track-{slot.name}",
                                           daemon=True)
            slot.thread.start()
        self.watch = threading.Thread(target=self._watch, name="raytrain-trackers-watch", daemon=True)
        self.watch.start()

    # -- the training thread's side: never waits on a tracker longer than its bound ---------------------
    def report(self, metrics: dict[str, Any]) -> None:
        for slot in self.slots:
            if slot.dead is None:
                slot.queue.put(("metrics", dict(metrics)))

    def pending(self) -> int:
        """Reports queued or being logged by trackers still alive."""
        return sum(slot.queue.unfinished_tasks for slot in self.slots if slot.dead is None)

    @property
    def active(self) -> list[Any]:
        return [slot.tracker for slot in self.slots if slot.dead is None and slot.tracker is not None]

    def note(self, summary: dict[str, Any]) -> None:
        """A note mid-run (the hang watchdog's summary): each tracker's summary (MLflow tags, W&B summary,
        TensorBoard text), queued like a report."""
        for slot in self.slots:
            if slot.dead is None:
                slot.queue.put(("note", dict(summary)))

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued report is logged by every tracker still alive: before a checkpoint (the
        restore point: no step at or below it may be lost when a worker dies) and when training raised. A
        tracker that hangs is dropped after its bound, which ends the wait for it."""
        deadline = time.monotonic() + timeout_s
        while self.pending() and time.monotonic() < deadline:
            self._check_bounds()
            time.sleep(0.02)

    def finish(self, summary: dict[str, Any], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for slot in self.slots:
            if slot.dead is None:
                slot.queue.put(("finish", summary))
        for slot in self.slots:
            while slot.dead is None and slot.thread.is_alive() and time.monotonic() < deadline:
                self._check_bounds()
                slot.thread.join(timeout=0.05)
        self._closing.set()

    # -- bounds ---------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closing.wait(WATCH_EVERY_S):
            self._check_bounds()

    def _check_bounds(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            since = slot.busy_since
            if slot.dead is not None or since is None:
                continue
            bound = START_TIMEOUT_S if slot.busy_with == "start" else CALL_TIMEOUT_S
            if now - since > bound:
                self._drop(slot, f"its {slot.busy_with} did not return within {bound:g} s")

    def _drop(self, slot: _Slot, reason: str) -> None:
        with self._lock:
            if slot.dead is not None:
                return
            slot.dead = reason
        from raytrain import events

        events.emit(events.TRACKER, name=slot.name, state="dropped", reason=reason)
        self.log(f"raytrain: --track {slot.name}: {reason}; training goes on without it")
        while True:  # what it had queued will never be logged: flush and finish stop waiting for it
            try:
                slot.queue.get_nowait()
                slot.queue.task_done()
            except queue.Empty:
                break
            except ValueError:
                break

    # -- each tracker's thread ------------------------------------------------------------------------
    def _run(self, slot: _Slot) -> None:
        while slot.dead is None:
            kind, data = slot.queue.get()
            try:
                if slot.dead is not None:
                    return
                if kind == "start":
                    self._start(slot)
                elif kind == "finish":
                    self._finish(slot, data)
                    return
                elif kind == "note":
                    self._call(slot, "summary", data, slot.step)
                else:
                    self._log(slot, data)
            finally:
                slot.busy_since = None
                with contextlib.suppress(ValueError):  # a dropped slot's queue was emptied already
                    slot.queue.task_done()

    def _start(self, slot: _Slot) -> None:
        slot.busy_with = "start"
        try:
            if slot.name == "mlflow":
                bound_mlflow_retries()
            tracker = KINDS[slot.name](self.state.of(slot.name), run_dir=self._run_dir, run_name=self.run_name,
                                       plan=self.plan, params=self._params)
        except ImportError as exc:
            self._drop(slot, f"{exc.name or exc} is not installed on the cluster (pip install 'raytrain[track]')")
            return
        except Exception as exc:  # noqa: BLE001 - a tracker never stops training
            self._drop(slot, f"cannot start ({type(exc).__name__}: {exc})")
            return
        if slot.dead is not None:  # it came back after its bound: dropped already
            with contextlib.suppress(Exception):
                tracker.close()
            return
        slot.tracker = tracker
        with self._lock:
            self.state.save()

    def _log(self, slot: _Slot, metrics: dict[str, Any]) -> None:
        step = int(metrics.get("step", 0))
        slot.step = max(slot.step, step)
        values = numbers(metrics)
        state = self.state.of(slot.name)
        if step <= state.get("last_step", 0):
            return  # logged before a restart: one value per step
        if time.monotonic() - slot.last_memory > MEMORY_EVERY_S:
            slot.last_memory = time.monotonic()
            values.update(self._memory())
        if self._call(slot, "log", values, step):
            with self._lock:
                state["last_step"] = step
                self.state.save()  # at once: a worker killed during the next call repeats nothing

    def _memory(self) -> dict[str, float]:
        return {f"memory/peak_rank{r}_gb": round(v / 1e9, 4) for r, v in sorted(peak_memory(self.record_dir).items())}

    def _finish(self, slot: _Slot, summary: dict[str, Any]) -> None:
        memory = self._memory()  # every worker's final peak, as metrics at the last step too
        summary = {**summary, **memory}
        if memory and slot.step:
            self._call(slot, "log", memory, slot.step)
        self._call(slot, "summary", summary, slot.step)
        self._call(slot, "close")
        with self._lock:
            self.state.save()

    def _call(self, slot: _Slot, method: str, *args: Any) -> bool:
        if slot.dead is not None or slot.tracker is None:
            return False
        slot.busy_with, slot.busy_since = method, time.monotonic()
        try:
            getattr(slot.tracker, method)(*args)
        except Exception as exc:  # noqa: BLE001 - a tracker's failure never fails training
            slot.failures += 1
            self.log(f"raytrain: --track {slot.name}: {method} failed ({type(exc).__name__}: {exc})")
            if slot.failures >= MAX_FAILURES:
                self._drop(slot, f"{slot.failures} calls failed in a row, the last: {method} "
                                 f"({type(exc).__name__}: {exc})")
            return False
        finally:
            slot.busy_since = None
        slot.failures = 0
        return slot.dead is None


# How a run that did not succeed ends in each tracker: MLflow's run status, W&B's exit code.
ENDINGS = {"failed": ("FAILED", 1), "stopped": ("KILLED", 143)}


_mlflow_clients: dict[str, Any] = {}


def mlflow_client(uri: str) -> Any:
    """One MlflowClient per tracking URI in this process (the driver's, made ready by ``warm_up``)."""
    from mlflow.tracking import MlflowClient

    bound_mlflow_retries()
    if uri not in _mlflow_clients:
        _mlflow_clients[uri] = MlflowClient(tracking_uri=uri)
    return _mlflow_clients[uri]


def warm_up(record_dir: Path | None, *, every_s: float = 2.0, timeout_s: float | None = None,
            plan: Any = None) -> bool:
    """The driver's MLflow client for rank 0's run, ready (imported, its store open, the run read) as soon as
    rank 0 has started the run: `jobs stop` leaves the driver 3 s, too short to open a SQLite store on a
    busy machine. True when ready; False after ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while record_dir is not None:
        found = State(record_dir)
        if plan is not None:
            found.trust(plan, record_dir.parent, log=lambda line: None)
        state = found.data.get("mlflow", {})
        if state.get("run_id"):
            mlflow_client(state["uri"]).get_run(state["run_id"])
            return True
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(every_s)
    return False


def end_mlflow(state: dict, outcome: str, **_: Any) -> None:
    mlflow_client(state["uri"]).set_terminated(state["run_id"], status=ENDINGS[outcome][0])


def end_wandb(state: dict, outcome: str, *, plan: Any, run_dir: Path, run_name: str) -> None:
    import wandb

    # its own folder: W&B names a run's folder by the second it starts, and a driver ending the run in the
    # second its last worker died would write into (and clobber) that worker's offline run files
    from raytrain import paths

    folder = paths.private_mkdir(run_dir / "wandb" / "driver")
    run = wandb.init(project=plan.name, name=run_name, id=state["id"], resume="allow", dir=str(folder),
                     reinit="create_new")
    run.finish(exit_code=ENDINGS[outcome][1])


ENDERS = {"mlflow": (end_mlflow, "run_id"), "wandb": (end_wandb, "id")}


def end_runs(plan: Any, record_dir: Path | None, outcome: str, *, run_name: str = "", log=print) -> list[str]:
    """The driver, when the raytrain run is over without success (``outcome``: "failed" after the last
    allowed restart, "stopped" by `jobs stop`): end each tracker run that rank 0 started as such (MLflow
    FAILED or KILLED, W&B a non-zero exit code), instead of leaving it running. Restarts within the run never
    come here: they append to the same tracker run. Returns the trackers ended."""
    if record_dir is None or not plan.track:
        return []
    state, ended = State(record_dir), []
    state.trust(plan, record_dir.parent, log)
    for name in plan.track:
        end, key = ENDERS.get(name, (None, ""))
        if end is None or not state.data.get(name, {}).get(key):
            continue  # TensorBoard has no run status; a tracker rank 0 never started has nothing to end
        try:
            end(state.data[name], outcome, plan=plan, run_dir=record_dir.parent, run_name=run_name)
            ended.append(name)
        except Exception as exc:  # noqa: BLE001 - a tracker's failure never hides the run's own
            log(f"raytrain: --track {name}: cannot mark the run {outcome} ({type(exc).__name__}: {exc})")
    return ended


def start(plan: Any, *, rank: int, run_name: str, log=print) -> Trackers | None:
    """Rank 0's trackers for ``plan.track``; None on other ranks or without --track."""
    if rank != 0 or not plan.track:
        return None
    from raytrain import run_record

    return Trackers(plan, run_name=run_name, record_dir=run_record.record_dir(plan.storage, run_name), log=log)
