"""Any Ray cluster reachable through its dashboard's Jobs API (``--address``)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Callable

import raytrain
from raytrain import compat, events, flight_recorder, placement
from raytrain.capacity import Node
from raytrain.clusters.dashboard import METADATA_KEY, Dashboard, token_headers, user_token
from raytrain.config.plan import Plan
from raytrain.errors import ClusterError, RaytrainError
from raytrain.events import JobFacts
from raytrain.status import JobInfo, state_of
from raytrain.targets import upload
from raytrain.targets.base import (
    RELEASE_WAIT_S,
    RUNTIME_ENV_VARS,
    tuning_env_vars,
    SECRET_EXCLUDES,
    JobHandle,
    Request,
    Target,
    allocator_env_vars,
    new_submission_id,
    shipped_plan,
)


# Following a job: how often its status is read before the driver's last word, how many reads in a row
# (and for at least how long) may fail before the follow gives up, how long one read may take, and how long
# the log tail may go on after the job ended without the driver's last word.
FOLLOW_STATUS_POLL_S = 2.0
FOLLOW_STATUS_FAILURES = 5
FOLLOW_STATUS_GIVE_UP_S = 30.0
FOLLOW_STATUS_CALL_S = 30.0
FOLLOW_TAIL_GRACE_S = 10.0
# One Jobs API read or stop through Ray's client (status, logs, list, stop), which sets no timeout of its own:
# a dashboard that never answers must not hang a command (a Ctrl-C's stop included)
JOBS_API_CALL_S = 120.0
# The probe of the cluster's versions: a trivial job ends in about 5 s on a 2-core machine; a refusal must
# come within 10 s of the command.
VERSION_PROBE_WAIT_S = 8.0


TERMINAL = ("STOPPED", "SUCCEEDED", "FAILED")  # Ray's JobStatus values of an ended job


class JobsRest:
    """The Jobs API's reads, log tail and stop as Ray's client sends them (``GET /api/jobs/``,
    ``GET /api/jobs/{id}``, ``GET /api/jobs/{id}/logs``, the websocket ``/api/jobs/{id}/logs/tail``,
    ``POST /api/jobs/{id}/stop``: Ray's documented REST API), without importing Ray's client
    (``ray.job_submission`` and Ray with it: 0.5 s of CPU, half of a `jobs status|logs|list` command). Errors
    read as Ray's client's do; each call is bounded by the caller (``_call``)."""

    def __init__(self, dashboard: Dashboard):
        self.dashboard = dashboard

    def _request(self, method: str, path: str, body: dict | None = None, read_s: float = JOBS_API_CALL_S) -> object:
        import requests

        resp = requests.request(method, self.dashboard.address + path, headers=self.dashboard.headers, json=body,
                                timeout=(10, read_s))
        if resp.status_code != 200:  # Ray's client's wording: submit()'s retries read it
            raise RuntimeError(f"Request failed with status code {resp.status_code}: {resp.text}.")
        return resp.json()

    def submit_job(self, body: dict) -> str:
        """``POST /api/jobs/`` with the body Ray's client sends; the job's submission id."""
        return self._request("POST", "/api/jobs/", body, read_s=60)["submission_id"]

    def get_job_info(self, job_id: str) -> JobDetails:
        return JobDetails.of(self._request("GET", f"/api/jobs/{job_id}"))

    def get_job_status(self, job_id: str) -> str:
        return self.get_job_info(job_id).status

    def get_job_logs(self, job_id: str) -> str:
        return self._request("GET", f"/api/jobs/{job_id}/logs")["logs"]

    def list_jobs(self) -> list[JobDetails]:
        return [JobDetails.of(entry) for entry in self._request("GET", "/api/jobs/")]

    def stop_job(self, job_id: str) -> bool:
        return bool(self._request("POST", f"/api/jobs/{job_id}/stop")["stopped"])

    async def tail_job_logs(self, job_id: str):
        """The log as the driver writes it (the websocket ``/api/jobs/{id}/logs/tail``), chunk by chunk, until
        the dashboard closes it; a connection lost or in error raises RuntimeError, as Ray's client's."""
        import aiohttp

        async with aiohttp.ClientSession(headers=self.dashboard.headers) as session:
            ws = await session.ws_connect(f"{self.dashboard.address}/api/jobs/{job_id}/logs/tail")
            while True:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.TEXT:
                    yield msg.data
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    if ws.close_code == aiohttp.WSCloseCode.ABNORMAL_CLOSURE:
                        raise RuntimeError(f"WebSocket connection closed unexpectedly with close code {ws.close_code}")
                    return
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise RuntimeError(f"WebSocket error for job {job_id}: {ws.exception()}")


@dataclasses.dataclass
class JobDetails:
    """The fields of Ray's ``JobDetails`` raytrain reads."""
    submission_id: str | None = None
    job_id: str | None = None
    status: str = ""
    entrypoint: str = ""
    message: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    metadata: dict | None = None

    @classmethod
    def of(cls, data: dict) -> "JobDetails":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _on_daemon_thread(fn: Callable, args: tuple, deliver: Callable[[bool, object], None], name: str) -> None:
    """Start ``fn(*args)`` on a daemon thread, which hands ``deliver`` (True, its result) or (False, its
    exception)."""
    import threading

    def run() -> None:
        try:
            outcome = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            outcome = (False, exc)
        deliver(*outcome)

    threading.Thread(target=run, daemon=True, name=name).start()


def _bounded(fn: Callable, *args, timeout_s: float):
    """``fn(*args)`` on a daemon thread, given up (TimeoutError) after ``timeout_s``; its own exception re-raised
    here. A call given up on is left to end by itself (or with the process)."""
    import threading

    outcome: list = []
    done = threading.Event()

    def deliver(ok: bool, value) -> None:
        outcome.append((ok, value))
        done.set()

    _on_daemon_thread(fn, args, deliver, "raytrain-jobs-api")
    if not done.wait(timeout_s):
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


async def _in_daemon_thread(fn: Callable, *args, timeout_s: float):
    """``fn(*args)`` on a daemon thread, given up (TimeoutError) after ``timeout_s``: a hung call neither
    blocks the follow nor, as ``asyncio.to_thread``'s executor would, the interpreter's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value) -> None:
        if not done.done():
            (done.set_result if ok else done.set_exception)(value)

    def deliver(ok: bool, value) -> None:
        with contextlib.suppress(RuntimeError):  # the follow gave up on it and its loop is closed
            loop.call_soon_threadsafe(settle, ok, value)

    _on_daemon_thread(fn, args, deliver, "raytrain-follow-status")
    try:
        return await asyncio.wait_for(done, timeout_s)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {timeout_s:g} s") from None


class LastWord:
    """What a job's log tail has delivered, and whether the driver has printed its last event (finished,
    error, capacity, invalid, stopped): after it the driver only exits."""

    LAST = (events.FINISHED, events.ERROR, events.CAPACITY, events.INVALID, events.STOPPED)

    def __init__(self) -> None:
        self.text: list[str] = []
        self.partial = ""
        self.said = False

    def add(self, chunk: str) -> None:
        self.text.append(chunk)
        *lines, self.partial = (self.partial + chunk).split("\n")
        for line in lines:
            for event in events.parse_events(line):
                if event["event"] in self.LAST and not line.startswith("("):  # the driver's, not a worker's
                    self.said = True

    def rest_of(self, full: str) -> str:
        """What of the job's ``full`` log the tail has not delivered yet."""
        return full[len("".join(self.text)):]  # the tail reads the same file from its start


def with_default_storage(plan: Plan, default: str | None) -> Plan:
    """The plan with the target's default storage where --storage was not given: a copy, never a change."""
    if plan.storage is None and default:
        return dataclasses.replace(plan, storage=default)
    return plan


def nothing_to_upload(runtime_env: dict) -> bool:
    """A runtime env without local paths for Ray's client to zip and upload (the local target's)."""
    return not runtime_env.get("working_dir") and not runtime_env.get("py_modules")


class RayJobsApiTarget(Target):
    """Submit to the Jobs API at ``address``. ``python`` is the interpreter the entrypoint runs with."""

    kind = "address"
    runtime_env_vars: dict[str, str] = {}  # this target's additions to RUNTIME_ENV_VARS
    # whether the nodes may be raytrain's (`cluster up`/`join`), whose worker processes can preload jemalloc
    raytrain_nodes = True

    def __init__(self, address: str, *, token: str | None = None, python: str = "python", ship_raytrain: bool = True):
        self.python = python
        self.ship_raytrain = ship_raytrain
        self._connect(address, token if token is not None else user_token())

    def _connect(self, address: str, token: str | None) -> None:
        self.dashboard = Dashboard(address, token_headers(token))
        self.address = self.dashboard.address
        self._client = None
        self._rest: JobsRest | None = None
        self._version_checked = False

    # -- building the request (no side effects) ---------------------------------------------------
    def default_storage(self) -> str | None:
        return None  # Ray's default on the head node (~/ray_results)

    def runtime_env(self, plan: Plan, run_name: str, shipped: upload.Upload | None = None) -> dict:
        env_vars = {**RUNTIME_ENV_VARS, **tuning_env_vars(), **allocator_env_vars(plan, jemalloc=self.raytrain_nodes),
                    **self.runtime_env_vars, **flight_recorder.env_vars(plan, run_name, plan.env), **plan.env,
                    "RAYTRAIN_PLAN": shipped_plan(plan),
                    "RAYTRAIN_RUN_NAME": run_name}
        shipped = shipped or upload.scan(plan.job_dir, SECRET_EXCLUDES)
        runtime_env = {
            "working_dir": plan.job_dir,
            "excludes": shipped.excludes,
            "env_vars": env_vars,
        }
        if self.ship_raytrain:
            # The cluster runs exactly this raytrain's worker runtime, whatever its image has installed.
            runtime_env["py_modules"] = [str(Path(raytrain.__file__).parent)]
        return runtime_env

    def dry_run(self, plan: Plan) -> Request:
        plan = with_default_storage(plan, self.default_storage())
        submission_id = new_submission_id(plan.name)
        shipped = upload.scan(plan.job_dir, SECRET_EXCLUDES)
        return Request(
            target=self.kind,
            address=self.address,
            submission_id=submission_id,
            run_name=submission_id,
            entrypoint=f"{self.python} -m raytrain.runtime.driver.entrypoint",
            runtime_env=self.runtime_env(plan, submission_id, shipped),
            metadata={
                METADATA_KEY: raytrain.__version__,
                "name": plan.name,
                "job": plan.job_module,
                "workers": str(plan.scaling.num_workers),
                "zero": str(plan.zero),
                "precision": plan.precision,
            },
            plan=plan,
            upload=shipped.summary(),
        )

    # -- talking to the cluster -------------------------------------------------------------------
    def check_ray_version(self, version_info: dict) -> None:
        """Refuse a cluster whose Ray raytrain's runtime cannot run on, naming both versions."""
        problem = compat.ray_version_problem(str(version_info.get("ray_version") or ""), self.address,
                                             compat.local_ray_version())
        if problem:
            raise ClusterError(problem)

    def check_versions(self, timeout_s: float = VERSION_PROBE_WAIT_S) -> list[str]:
        """Refuse a cluster whose Ray, Python, torch or DeepSpeed raytrain's runtime cannot run on (ClusterError:
        one line naming both versions and what to do); the warnings about versions newer than tested."""
        ray = str(self.dashboard.check_reachable().get("ray_version") or "")
        local = compat.local_versions()
        problem, warnings = compat.check_versions({"ray": ray}, self.address, local)
        if problem:
            raise ClusterError(problem)
        found, why = self.cluster_versions(timeout_s)
        if found is None:
            return [*warnings, f"could not learn the cluster's Python, torch and DeepSpeed: {why}; submitting "
                               f"anyway (the job fails on the cluster if it cannot run there)"]
        problem, more = compat.check_versions({k: v for k, v in found.items() if k != "ray"}, self.address, local)
        if problem:
            raise ClusterError(problem)
        return [*warnings, *more]

    def cluster_versions(self, timeout_s: float = VERSION_PROBE_WAIT_S) -> tuple[dict | None, str]:
        """The Python, Ray, torch and DeepSpeed the cluster's jobs run with, from a tiny Ray job whose
        entrypoint reads package metadata (no upload, nothing but the standard library imported). (None, why)
        when it does not answer within ``timeout_s`` (the probe job is then stopped)."""
        import shlex
        import time

        import requests

        job_id = new_submission_id("versions")
        base = self.address + "/api/jobs/"
        body = {"entrypoint": f"{self.python} -c {shlex.quote(compat.PROBE_CODE)}", "submission_id": job_id,
                "metadata": {"raytrain-utility": "versions"}, "entrypoint_num_cpus": 0}
        headers = self.dashboard.headers
        deadline = time.monotonic() + timeout_s
        status = "not submitted"
        try:
            resp = requests.post(base, json=body, headers=headers, timeout=max(1.0, timeout_s))
            if resp.status_code != 200:
                return None, f"the Jobs API at {self.address} refused the probe job (HTTP {resp.status_code})"
            status = "PENDING"
            while time.monotonic() < deadline:
                info = requests.get(base + job_id, headers=headers, timeout=5).json()
                status = str(info.get("status") or status)
                if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                    logs = requests.get(base + job_id + "/logs", headers=headers, timeout=5).json().get("logs")
                    found = compat.parse_probe(logs or "")
                    if found is None:
                        return None, f"the probe job {job_id} ended {status} without its line: {info.get('message')}"
                    return found, ""
                time.sleep(0.2)
            return None, (f"the probe job {job_id} was still {status} after {timeout_s:.0f} s (a busy cluster, or "
                          f"one with no CPU free for a job's entrypoint)")
        except (requests.RequestException, ValueError) as exc:
            return None, f"the probe job {job_id} ({status}) could not be followed: {exc}"
        finally:
            if status not in ("SUCCEEDED", "FAILED", "STOPPED", "not submitted"):
                self._stop_probe(base + job_id, headers)

    @staticmethod
    def _stop_probe(url: str, headers: dict) -> None:
        """An ended probe job stays listed (a delete races its supervisor's exit, which writes it back as
        FAILED), like the other utility jobs: `raytrain jobs list` shows only raytrain's runs."""
        import requests

        try:
            requests.post(url + "/stop", headers=headers, timeout=2)
        except requests.RequestException:
            pass

    def _ready(self) -> None:
        """Before the Jobs API is used: what a target needs first (a running cluster, an open tunnel)."""

    def _check_version_once(self) -> None:
        """The cluster's Ray version, checked once for ``client`` and ``rest`` together (fail fast, before a Jobs
        API call)."""
        if not self._version_checked:
            self.check_ray_version(self.dashboard.check_reachable())
            self._version_checked = True

    @property
    def client(self):
        self._ready()
        if self._client is None:
            self._check_version_once()
            import logging

            from ray.job_submission import JobSubmissionClient

            from raytrain.ray_tuning.ray_access import NOISY_CLIENT_LOGGERS

            for noisy in NOISY_CLIENT_LOGGERS:
                logging.getLogger(noisy).setLevel(logging.WARNING)  # uploads, websocket closes

            try:
                self._client = JobSubmissionClient(self.address, headers=dict(self.dashboard.headers))
            except Exception as exc:
                raise ClusterError(f"cannot use the Jobs API at {self.address}: {exc}") from exc
        return self._client

    @property
    def rest(self) -> JobsRest:
        """The Jobs API's reads and stop (``JobsRest``), the cluster's Ray version checked first (as ``client``)."""
        self._ready()
        if self._rest is None:
            self._check_version_once()
            self._rest = JobsRest(self.dashboard)
        return self._rest

    def nodes(self, request: Request | None = None) -> list[Node]:
        return self.dashboard.nodes()

    def reconnect_flags(self) -> list[str]:
        return ["--address", self.address]

    def submit(self, request: Request, *, agent_wait_s: float = 30.0) -> JobHandle:
        import time

        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                if nothing_to_upload(request.runtime_env):
                    job_id = self._post_job(request)
                else:
                    job_id = self.client.submit_job(
                        entrypoint=request.entrypoint,
                        submission_id=request.submission_id,
                        runtime_env=request.runtime_env,
                        metadata=request.metadata,
                        entrypoint_num_cpus=request.entrypoint_num_cpus,
                    )
                break
            except RaytrainError:
                raise
            except Exception as exc:
                # A head that has just started answers 500 until its job agent registers: wait a little.
                if "No available agent" in str(exc) and time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                if "already exists" in str(exc):  # a retried submit: the job is there, never start it twice
                    job_id = request.submission_id
                    break
                raise ClusterError(f"submitting to {self.address} failed: {exc}") from exc
        return JobHandle(self.kind, self.address, job_id, request.metadata.get("name", ""))

    def _post_job(self, request: Request) -> str:
        """The Jobs API's ``POST /api/jobs/``, as Ray's client sends it, for a request with nothing to upload:
        Ray's client (``ray.job_submission``) is not imported before the job exists (~1 CPU second and
        more wall time on a busy machine, on the path from the command to step 1)."""
        body = {"entrypoint": request.entrypoint, "submission_id": request.submission_id,
                "runtime_env": request.runtime_env, "metadata": request.metadata,
                "entrypoint_num_cpus": request.entrypoint_num_cpus}
        return JobsRest(self.dashboard).submit_job(body)

    def _info(self, details, facts: JobFacts | None) -> JobInfo:
        meta = dict(details.metadata or {})
        status = getattr(details.status, "value", details.status)
        return JobInfo(
            job_id=details.submission_id or details.job_id,
            name=meta.get("name", ""),
            state=state_of(status, facts),
            target=self.kind,
            address=self.address,
            entrypoint=details.entrypoint or "",
            message=details.message or "",
            start_time=details.start_time / 1000 if details.start_time else None,
            end_time=details.end_time / 1000 if details.end_time else None,
            metadata=meta,
            facts=facts,
            ray_job_id=getattr(details, "job_id", None) or "",
        )

    def _call(self, what: str, fn, *args, timeout_s: float | None = None):
        timeout_s = JOBS_API_CALL_S if timeout_s is None else timeout_s
        try:
            return _bounded(fn, *args, timeout_s=timeout_s)
        except RaytrainError:
            raise
        except TimeoutError as exc:
            raise ClusterError(f"{what}: no answer from {self.address} within {timeout_s:.0f} s (an overloaded or "
                               "stuck dashboard?); try again") from exc
        except RuntimeError as exc:
            text = str(exc)
            if "does not exist" in text or "404" in text:
                raise ClusterError(f"no job {args[0]!r} on {self.address} (see `raytrain jobs list`)") from exc
            raise ClusterError(f"{what} failed on {self.address}: {text}") from exc

    def status(self, job_id: str, *, with_facts: bool = True) -> JobInfo:
        details = self._call("job status", self.rest.get_job_info, job_id)
        facts = JobFacts.from_lines(self.logs(job_id).splitlines()) if with_facts else None
        return self._info(details, facts)

    def logs(self, job_id: str) -> str:
        return self._call("job logs", self.rest.get_job_logs, job_id)

    def follow(self, job_id: str, on_text: Callable[[str], None], end_poll_s: float = 0.2,
               status_poll_s: float = FOLLOW_STATUS_POLL_S) -> None:
        """Stream the job's log until the job has ended. Ray's log tail only ends 2-3 s after the job (it
        sleeps 1 s at every end of file, then once more after seeing the job end): once the driver has
        printed its last event, the job's status is polled instead, and the log's rest read in one piece as
        soon as the job has ended. The status is also read every ``status_poll_s`` before that: a job that
        ended without the driver's last word (a killed driver) gives the tail ``FOLLOW_TAIL_GRACE_S`` more,
        and a status that cannot be read ``FOLLOW_STATUS_FAILURES`` times in a row over at least
        ``FOLLOW_STATUS_GIVE_UP_S`` ends the follow with a ClusterError saying so (a transient error is
        only retried). A job that has already ended: its log, read in one piece."""
        details = self._call("job status", self.rest.get_job_info, job_id)  # a clear error for an unknown id
        if getattr(details.status, "value", details.status) in TERMINAL:
            on_text(self.logs(job_id))  # its log is whole: Ray's tail would give it in 1-3 s, in pieces
            return
        seen = LastWord()

        async def tail() -> None:
            async for chunk in self.rest.tail_job_logs(job_id):
                seen.add(chunk)
                on_text(chunk)

        async def both() -> bool:
            """Whether the job ended before the tail did (the log's rest is still to be read)."""
            tailing = asyncio.ensure_future(tail())
            ending = asyncio.ensure_future(self._ended(job_id, seen, end_poll_s, status_poll_s))
            await asyncio.wait([tailing, ending], return_when=asyncio.FIRST_COMPLETED)
            cut = not tailing.done()
            for task in (ending, tailing):  # the status's error first: it says why the follow ends
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # the tail's own errors come out here
            return cut

        rest = seen.rest_of(self.logs(job_id)) if asyncio.run(both()) else ""
        if rest:
            on_text(rest)

    async def _ended(self, job_id: str, seen: LastWord, end_poll_s: float, status_poll_s: float) -> None:
        """Returns once the job has ended (see ``follow``); raises ClusterError once its status has failed for
        the bound."""
        failures, failing_since, ended_at = 0, 0.0, None
        while True:
            try:
                terminal = (await _in_daemon_thread(self.rest.get_job_status, job_id,
                                                    timeout_s=FOLLOW_STATUS_CALL_S)) in TERMINAL
                failures = 0
            except Exception as exc:  # noqa: BLE001 - retried, then said with the last error
                if not failures:
                    failing_since = time.monotonic()
                failures += 1
                failing_s = time.monotonic() - failing_since
                if failures >= FOLLOW_STATUS_FAILURES and failing_s >= FOLLOW_STATUS_GIVE_UP_S:
                    raise ClusterError(
                        f"lost track of job {job_id} on {self.address}: its status could not be read "
                        f"{failures} times in a row over {failing_s:.0f} s (last error: "
                        f"{type(exc).__name__}: {exc}); the job may still be running: "
                        f"`raytrain jobs status {job_id}` asks again"
                    ) from exc
                terminal = False
            if terminal:
                if seen.said:
                    return
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at >= FOLLOW_TAIL_GRACE_S:
                    return  # the tail did not end with the job: read the rest in one piece
            # the next read: every status_poll_s, and at once (then every end_poll_s) after the driver's last word
            said, wait_until = seen.said, time.monotonic() + (end_poll_s if seen.said or ended_at else status_poll_s)
            while time.monotonic() < wait_until and seen.said == said:
                await asyncio.sleep(min(end_poll_s, max(0.0, wait_until - time.monotonic())))

    def stop(self, job_id: str) -> bool:
        return bool(self._call("job stop", self.rest.stop_job, job_id))

    def held_by(self, ray_job_id: str) -> tuple[list[dict], list[dict]]:
        """What a Ray job still holds: its live actors that die with it (workers, controller) and its live
        placement groups."""
        actors = [a for a in self.dashboard.live_actors(ray_job_id) if not a.get("is_detached")]
        return actors, placement.of_job(self.dashboard.placement_groups(), ray_job_id)

    def release(self, info: JobInfo, timeout_s: float = RELEASE_WAIT_S, poll_s: float = 0.25) -> str:
        if not info.ray_job_id:
            return ""  # the driver never started: it placed nothing
        deadline = time.monotonic() + timeout_s
        actors, groups = self.held_by(info.ray_job_id)
        while (actors or groups) and time.monotonic() < deadline:
            time.sleep(poll_s)
            actors, groups = self.held_by(info.ray_job_id)
        removed = ""
        if groups and not actors:  # Ray leaked them (a job stopped while its workers start): remove them
            self.run_utility("raytrain.runtime.driver.placement_watch", events.CLEANED)
            actors, groups = self.held_by(info.ray_job_id)
            removed = " (removed the placement group Ray leaked)"
        if actors or groups:
            held = [f"{len(actors)} actor(s) ({', '.join(sorted({a.get('class_name', '?') for a in actors}))})"
                    if actors else "", f"{len(groups)} placement group(s)" if groups else ""]
            raise RaytrainError(
                f"{info.job_id} stopped, but {' and '.join(h for h in held if h)} of it still exist "
                f"{timeout_s:.0f} s later on {self.address}; `raytrain cluster down` frees them"
            )
        return f"; its workers and placement groups are gone{removed}"

    def run_utility(self, module: str, event_kind: str, timeout_s: float = 120.0, args: tuple[str, ...] = ()) -> dict:
        """Run ``python -m MODULE ARGS`` as a short Ray job and return the event it prints (e.g. GPU inventory)."""
        import shlex
        import time

        from raytrain.events import parse_events

        runtime_env: dict = {"env_vars": {"PYTHONUNBUFFERED": "1"}}
        if self.ship_raytrain:
            runtime_env["py_modules"] = [str(Path(raytrain.__file__).parent)]
        job_id = new_submission_id(module.rsplit(".", 1)[-1])
        self.client.submit_job(
            entrypoint=" ".join([self.python, "-m", module, *map(shlex.quote, args)]), submission_id=job_id,
            runtime_env=runtime_env, metadata={"raytrain-utility": module},
        )
        deadline = time.monotonic() + timeout_s
        status = self.status(job_id, with_facts=False)
        while not status.state.terminal:
            if time.monotonic() > deadline:
                self.stop(job_id)
                raise ClusterError(f"{module} did not finish within {timeout_s:.0f} s on {self.address}")
            time.sleep(0.5)
            status = self.status(job_id, with_facts=False)
        for line in self.logs(job_id).splitlines():
            for event in parse_events(line):
                if event.get("event") == event_kind:
                    return event
        raise ClusterError(f"{module} failed on {self.address}: {status.message}")

    def list(self) -> list[JobInfo]:
        jobs = self._call("job list", self.rest.list_jobs)
        mine = [j for j in jobs if METADATA_KEY in (j.metadata or {})]
        return sorted((self._info(j, None) for j in mine), key=lambda i: i.start_time or 0, reverse=True)
