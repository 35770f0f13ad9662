"""The embedded local cluster as a submission target: started on demand, same Jobs API underneath."""
from __future__ import annotations

import sys

from raytrain import paths
from raytrain.capacity import Node
from raytrain.clusters import local_head
from raytrain.errors import ClusterError
from raytrain.targets.base import LOCAL_RUNTIME_ENV_VARS, JobHandle, Request
from raytrain.targets.ray_jobs import RayJobsTarget


class LocalTarget(RayJobsTarget):
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
            else f"http://127.0.0.1:{local_head.DEFAULT_DASHBOARD_PORT}"
        )
        super().__init__(
            address, token=self.cluster.token if self.cluster else "", python=sys.executable, ship_raytrain=False
        )

    def default_storage(self) -> str | None:
        return str(paths.default_storage())

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

    @property
    def client(self):
        if self.cluster is None:
            raise ClusterError("the local Ray cluster is not running; start it with `raytrain cluster up`")
        return super().client

    def nodes(self, request: Request | None = None) -> list[Node]:
        return [] if self.cluster is None else super().nodes(request)

    def submit(self, request: Request) -> JobHandle:
        self.ensure_running()
        return super().submit(request)
