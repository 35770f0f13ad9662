"""A run's own record in its storage, kept after the cluster is gone: every process's events
(``<storage>/<run>/raytrain/events-<who>.log``, each line ``<unix time> @@raytrain {json}``), the same lines
the job's log holds. `jobs metrics|plot|compare` read it, falling back to the job's log on the cluster."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from raytrain import paths, settings
from raytrain.storage import is_uri

if TYPE_CHECKING:
    from raytrain.status import JobInfo

FOLDER = "raytrain"


def run_folder(storage: str | None, run_name: str) -> Path | None:
    """A run's folder in its storage (its checkpoints, its record); None where the storage is not a path (a
    URI, or Ray's default)."""
    if not storage or is_uri(storage) or not run_name:
        return None
    return Path(storage).expanduser() / run_name


def record_dir(storage: str | None, run_name: str) -> Path | None:
    """Where a run keeps its record; None where the storage is not a path (a URI, or Ray's default)."""
    folder = run_folder(storage, run_name)
    return folder / FOLDER if folder is not None else None


def start(storage: str | None, run_name: str, who: str) -> str | None:
    """This process records its events under the run (``who``: "driver", "rank-0", ...); the file's path."""
    from raytrain import events

    folder = record_dir(storage, run_name)
    if folder is None:
        return None
    try:
        paths.private_mkdir(folder)
        path = str(folder / f"events-{who}.log")
        paths.private_open(path, "a").close()  # 0600: the events append to it as it is
    except OSError:
        return None
    events.record_to(path)
    return path


def start_from_env(who: str) -> str | None:
    """``start`` in a process of the job that is handed no plan, e.g. Ray Train's controller ("controller":
    the preflight, its timings, restarts): the run's storage and name come from the job's environment
    (``RAYTRAIN_PLAN``, ``RAYTRAIN_RUN_NAME``), which every actor of the job inherits. None where they are
    not there or the storage keeps no record; once per process."""
    from raytrain import events

    if events.recording():
        return events.recording()
    try:
        import json

        plan = json.loads(settings.raw("RAYTRAIN_PLAN") or "null")
        return start(plan.get("storage"), settings.get("RAYTRAIN_RUN_NAME") or plan.get("name", ""), who)
    except (KeyError, ValueError, AttributeError):
        return None


def read_timed(folder: Path, who: str = "*") -> list[tuple[float, str]]:
    """Every recorded event line of a run (``who``: of one process, e.g. "driver") with the time it was
    written, all processes merged in time order."""
    timed = []
    for path in sorted(folder.glob(f"events-{who}.log")):
        for n, line in enumerate(path.read_text(errors="replace").splitlines()):
            stamp, _, rest = line.partition(" ")
            try:
                timed.append((float(stamp), path.name, n, rest))
            except ValueError:
                continue
    return [(t, rest) for t, _, _, rest in sorted(timed)]


def last_step(folder: Path, tail_bytes: int = 1 << 16) -> int | None:
    """The step of the last metrics event of a run's record (rank 0 reports them), read from the end of rank 0's
    file: a long run's record holds millions of lines. None where its last ``tail_bytes`` hold none."""
    from raytrain import events

    path = folder / "events-rank-0.log"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if f'"event":"{events.METRICS}"' not in line:
            continue
        for event in reversed(events.parse_events(line)):
            if event.get("event") == events.METRICS:
                step = event.get("step")
                return step if isinstance(step, int) else None
    return None


def read_lines(folder: Path) -> list[str]:
    """Every recorded event line of a run, all processes merged in time order."""
    return [rest for _, rest in read_timed(folder)]


def job_info(job_id: str, folder: Path, why: str = "", *, steps: bool = True) -> "JobInfo":
    """Job ``job_id`` as its record tells it, where no cluster knows it any more (restarted, stopped, deleted):
    the driver's last word says how it ended (finished, error, stopped); a record that ends without one
    (the driver was killed, its machine went down) is FAILED. ``why``: what the cluster said, kept as a
    warning with where the facts come from. ``steps=False`` reads the driver's events only (state, name,
    workers, times; no metrics): a list of many long runs stays quick."""
    from raytrain.events import JobFacts
    from raytrain.status import JobInfo, JobState, outcome

    timed = read_timed(folder, "*" if steps else "driver")
    facts = JobFacts.from_lines(rest for _, rest in timed)
    started = facts.started or {}
    first, last = (timed[0][0], timed[-1][0]) if timed else (None, None)
    state, message = outcome(facts), ""
    if state is JobState.STOPPED:
        message = f"stopped ({facts.stopped.get('signal') or 'by a signal'})"
    elif state is None:
        step = (facts.last_metrics or {}).get("step")
        state = JobState.FAILED
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last)) if last else "its start"
        message = (f"the run's record ends at {at}{f' (step {step})' if step is not None else ''} without an outcome: "
                   "its driver was killed, or its machine or cluster went down")
    workers = started.get("workers")
    return JobInfo(
        job_id=job_id,
        name=str(started.get("name") or ""),
        state=state,
        target="record",
        address=str(folder),
        message=message,
        start_time=first,
        end_time=last,
        metadata={"workers": str(workers)} if workers is not None else {},
        facts=facts,
        problems=[f"from the run's record in {folder}" + (f" ({why})" if why else "")],
    )


def runs_in(storage: str | None) -> list[tuple[str, Path]]:
    """(run name, record folder) of every run recorded in ``storage`` (a path; none for a URI or None)."""
    if not storage or is_uri(storage):
        return []
    root = Path(storage).expanduser()
    try:
        children = sorted(root.iterdir())
    except OSError:
        return []
    return [(child.name, child / FOLDER) for child in children
            if not child.name.startswith(".") and (child / FOLDER / "events-driver.log").is_file()]


def _index_path(job_id: str) -> Path | None:
    from raytrain import paths

    if not job_id or not all(c.isalnum() or c in "._-" for c in job_id) or job_id.startswith("."):
        return None
    return paths.home() / "submitted" / job_id


def remember(job_id: str, storage: str | None) -> None:
    """Note on this machine where a submitted run keeps its record, so that `jobs logs --rank`, `jobs metrics`
    and friends find a run with a non-default ``--storage`` without being told again."""
    path = _index_path(job_id)
    if path is None or record_dir(storage, job_id) is None:
        return
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text(str(Path(storage).expanduser().resolve()) + "\n")
    except OSError:
        pass  # a convenience only: the commands still take --storage


def remembered_storage(job_id: str) -> str | None:
    """The storage ``remember`` noted for ``job_id`` on this machine, if any."""
    path = _index_path(job_id)
    try:
        return path.read_text().strip() or None if path is not None else None
    except OSError:
        return None


def find(job_id: str, storages: list[str | None]) -> Path | None:
    """The record of run ``job_id`` in the first of ``storages`` that has one; the storage noted at submit
    time on this machine comes after the first (the one the user named) and before the rest (defaults)."""
    for storage in [*storages[:1], remembered_storage(job_id), *storages[1:]]:
        folder = record_dir(storage, job_id)
        if folder is not None and folder.is_dir() and (any(folder.glob("events-*.log")) or (folder / "logs").is_dir()):
            return folder
    if os.path.isdir(job_id) and Path(job_id, FOLDER).is_dir():  # a run directory given as the id
        return Path(job_id, FOLDER)
    return None


_TRACKER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _under(path: str, roots: list[Path]) -> bool:
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(resolved == r or r in resolved.parents for r in (root.expanduser().resolve() for root in roots))


def trusted_trackers(data: object, run_dirs: list[Path], mlflow_uri: str | None) -> tuple[dict, list[str]]:
    """A trackers.json's entries that may be used: whoever can write the storage can write that file, so a
    tracker's folder (TensorBoard) or store (MLflow's SQLite) must lie under one of ``run_dirs`` (the run's
    own folder; on --resume the one it continues), its MLflow server must be the plan's ``mlflow_uri`` and its
    ids plain ids. Returns (the entries kept, a line for each one left out)."""
    kept: dict = {}
    dropped: list[str] = []
    for name, entry in (data.items() if isinstance(data, dict) else ()):
        problem = None
        if name not in ("tensorboard", "mlflow", "wandb") or not isinstance(entry, dict):
            problem = "not a tracker raytrain writes"
        elif not isinstance(entry.get("last_step", 0), int) or isinstance(entry.get("last_step", 0), bool):
            problem = f"last_step {entry.get('last_step')!r} is not a step"
        elif name == "tensorboard" and "dir" in entry and not (
                isinstance(entry["dir"], str) and _under(entry["dir"], run_dirs)):
            problem = f"its folder {entry['dir']!r} is outside the run's folder"
        elif name == "mlflow" and "uri" in entry:
            uri = entry["uri"]
            if mlflow_uri:
                ok = uri == mlflow_uri
            else:
                ok = isinstance(uri, str) and uri.startswith("sqlite:///") and _under(uri[len("sqlite:///"):], run_dirs)
            if not ok:
                problem = "its tracking URI is not this run's (--mlflow-uri, or the SQLite store in the run's folder)"
        if problem is None:
            for key in ("run_id", "id"):
                if key in entry and not (isinstance(entry[key], str) and _TRACKER_ID.match(entry[key])):
                    problem = f"its {key} is not an id"
        if problem:
            dropped.append(f"{name}: {problem}")
        else:
            kept[name] = entry
    return kept, dropped


def inherit_trackers(checkpoint: str, storage: str | None, run_name: str, mlflow_uri: str | None = None) -> bool:
    """``--resume``: the new run continues the tracker runs of the run ``checkpoint`` belongs to (its
    trackers.json, copied once: only the entries :func:`trusted_trackers` accepts for that run's folder and
    ``mlflow_uri``). True if there was one to copy."""
    import json

    source_run = Path(checkpoint).parent
    source = source_run / FOLDER / "trackers.json"
    folder = record_dir(storage, run_name)
    if folder is None or not source.is_file() or (folder / "trackers.json").exists():
        return False
    try:
        data = json.loads(source.read_text())
    except ValueError:
        return False
    kept, _ = trusted_trackers(data, [source_run], mlflow_uri)
    paths.private_mkdir(folder)
    paths.private_write(folder / "trackers.json", json.dumps(kept, sort_keys=True))
    return True


def rank_logs(folder: Path) -> dict[int, Path]:
    """rank -> its stdout/stderr copy (raytrain.runtime.worker.rank_log)."""
    out = {}
    for path in (folder / "logs").glob("rank-*.log"):
        try:
            out[int(path.stem.split("-", 1)[1])] = path
        except ValueError:
            continue
    return dict(sorted(out.items()))


def nodes_of(path: Path) -> set[str]:
    """The hosts and IPs a rank ran on (every attempt's header line names them)."""
    found = set()
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("# raytrain rank "):
                words = line.split()
                if len(words) >= 7:
                    found |= {words[5], words[6].strip("()")}
    return found


def tail(path: Path, lines: int = 15, keep=None) -> list[str]:
    """The last ``lines`` lines of a rank's log that are not raytrain's event lines; ``keep(line)``, when
    given, returns the line to show or None (raytrain.log_filter.LogFilter)."""
    from raytrain.events import MARKER

    text = [line for line in path.read_text(errors="replace").splitlines()
            if MARKER not in line and not line.startswith("# raytrain rank ")]
    if keep is not None:
        text = [shown for shown in map(keep, text) if shown is not None]
    return text[-lines:]
