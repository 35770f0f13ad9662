"""One small interface for every kind of cluster raytrain runs: up, status, down."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClusterOptions:
    """`cluster up|status|down` options, by name (None: not given)."""

    k8s: bool = False  # a KubeRay RayCluster (also implied by a `kind: kuberay` profile)
    profile: str | None = None  # cluster profile file (kind: local or kind: kuberay)
    # Kubernetes only
    name: str | None = None  # the RayCluster (default: the profile's)
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    # the local cluster only (`cluster up`)
    num_cpus: float | None = None
    num_gpus: float | None = None
    port: int | None = None
    dashboard_port: int | None = None
    node_ip: str | None = None
    resources: str | None = None  # JSON text, as --resources gives it


class Cluster(abc.ABC):
    """A cluster raytrain starts, reports on and stops. Each method returns what the CLI prints (text) or
    reports (a dict, as `--json` prints it)."""

    kind: str = "abstract"

    @abc.abstractmethod
    def up(self, *, dry_run: bool = False) -> str:
        """Start or create it (a no-op where it already runs as asked); with ``dry_run`` only what would be
        applied. The text to print (ends with a newline)."""

    @abc.abstractmethod
    def status(self) -> dict[str, Any]:
        """Its state, nodes and capacity (read-only)."""

    @abc.abstractmethod
    def down(self) -> str:
        """Stop or delete it; the text to print (ends with a newline)."""

    def jobs_in_use(self) -> list[str]:
        """The jobs that still run on it (one line each), which `cluster down` would stop: it lists them and
        asks, or needs --force."""
        return []
