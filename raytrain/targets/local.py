"""The embedded local cluster as a submission target: started on demand, same Jobs API underneath.

No upload: the local head runs on this machine and reads this file system, so instead of Ray's
``working_dir`` (zip, upload to the GCS, unpack for the job) a submit copies the files an upload would ship
(same excludes, .gitignore rules, symlink and size checks: targets/upload.py) to ``$RAYTRAIN_HOME/job-code/
<submission id>`` and puts that folder first on the job's ``PYTHONPATH`` (``RAYTRAIN_JOB_CODE`` names it; the
driver runs in it and removes it when it ends; ``cluster down`` removes what is left). The job runs a
snapshot taken at submit, as with an upload: editing job.py while a job runs changes neither that job nor its
worker restarts. A head started with ``--node-ip`` (other machines may join it) still uploads, and so does
``--env RAYTRAIN_LOCAL_UPLOAD=1``.
"""
from __future__ import annotations

import dataclasses
import shutil
import sys

from raytrain import paths, settings
from raytrain.capacity import Node
from raytrain.clusters import local_head
from raytrain.config.plan import Plan
from raytrain.errors import ClusterError
from raytrain.targets import upload
from raytrain.targets.base import LOCAL_RUNTIME_ENV_VARS, SECRET_EXCLUDES, JobHandle, Request
from raytrain.targets.ray_jobs_api import RayJobsApiTarget

CODE_ENV = "RAYTRAIN_JOB_CODE"  # the job's copy of its folder, when it runs without an upload
UPLOAD_ENV = "RAYTRAIN_LOCAL_UPLOAD"  # "1": upload the folder as working_dir, as on other clusters


class LocalTarget(RayJobsApiTarget):
    """Jobs run on this machine; the entrypoint uses this very interpreter, so raytrain is importable."""

    kind = "local"
    storage_is_local = True  # the run's storage is on this machine
    runtime_env_vars = LOCAL_RUNTIME_ENV_VARS

    def __init__(self, *, auto_start: bool = True):
        self.auto_start = auto_start
        self.cluster = local_head.current()
        address = (
            self.cluster.dashboard_url
            if self.cluster
            else f"http://127.0.0.1:{local_head.default_dashboard_port()}"
        )
        super().__init__(
            address, token=self.cluster.token if self.cluster else "", python=sys.executable, ship_raytrain=False
        )

    def default_storage(self) -> str | None:
        return str(paths.default_storage())

    def in_place(self, plan: Plan) -> bool:
        """Run from a local copy of the job's folder instead of an upload: the head is this machine's, bound
        to loopback (no other machine can join it), and RAYTRAIN_LOCAL_UPLOAD (--env or environment) is not 1."""
        given = (plan.env or {}).get(UPLOAD_ENV)  # the job's --env wins over this process's environment
        if settings.get(UPLOAD_ENV, None if given is None else {UPLOAD_ENV: given}):
            return False
        node_ip = self.cluster.node_ip if self.cluster else None
        return node_ip in (None, "", local_head.LOOPBACK)

    def runtime_env(self, plan: Plan, run_name: str, shipped: upload.Upload | None = None) -> dict:
        runtime_env = super().runtime_env(plan, run_name, shipped)
        if self.in_place(plan):
            code = str(paths.job_code_root() / run_name)
            runtime_env.pop("working_dir")
            runtime_env.pop("excludes")
            # Ray expands ${PYTHONPATH} to the head's own (which may be what makes raytrain importable).
            runtime_env["env_vars"].update({"PYTHONPATH": f"{code}:${{PYTHONPATH}}", CODE_ENV: code})
        return runtime_env

    def dry_run(self, plan: Plan) -> Request:
        # the runtime learns it runs on raytrain's own cluster from the plan (lean_trainer: no per-run placement-
        # group cleaner, no AutoscalingCoordinator); the caller's plan is not changed
        request = super().dry_run(dataclasses.replace(plan, local_cluster=True))
        code = request.runtime_env["env_vars"].get(CODE_ENV)
        if code:
            request.upload = {**request.upload, "copied_to": code}
        return request

    def running(self) -> bool:
        return self.cluster is not None

    def has_gpus(self) -> bool:
        """A local cluster not started yet will offer this machine's GPUs."""
        if self.cluster is None:
            from raytrain.nvml import gpu_count

            return gpu_count() > 0
        return super().has_gpus()

    def reconnect_flags(self) -> list[str]:
        return []  # the local cluster is the default

    def ensure_running(self) -> bool:
        """Start the cluster if it is not running; True if this call started it."""
        if self.cluster is not None:
            return False
        if not self.auto_start:
            raise ClusterError("the local Ray cluster is not running; start it with `raytrain cluster up`")
        self.cluster, started = local_head.up()
        self._connect(self.cluster.dashboard_url, self.cluster.token)
        return started

    def check_versions(self) -> list[str]:
        return []  # the local cluster runs this machine's Python and packages: pyproject.toml's pins hold

    def _ready(self) -> None:
        if self.cluster is None:
            raise ClusterError("the local Ray cluster is not running; start it with `raytrain cluster up`")

    def nodes(self, request: Request | None = None) -> list[Node]:
        return [] if self.cluster is None else super().nodes(request)

    def submit(self, request: Request) -> JobHandle:
        self.ensure_running()
        code = request.runtime_env.get("env_vars", {}).get(CODE_ENV)
        if code:  # the snapshot the job runs: what an upload would ship (scanned again: the dry run copied nothing)
            upload.scan(request.upload["folder"], SECRET_EXCLUDES).copy_to(code)
        try:
            return super().submit(request)
        except BaseException:
            if code:
                shutil.rmtree(code, ignore_errors=True)
            raise
