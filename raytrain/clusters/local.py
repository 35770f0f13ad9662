"""The local cluster as a ``Cluster``: the embedded head (local_head) and, for `down`, a joined node
(joined_node) of this RAYTRAIN_HOME."""
from __future__ import annotations

from typing import Any, Callable

from raytrain.clusters import joined_node, local_head, ray_process, ray_status
from raytrain.clusters.base import Cluster, ClusterOptions
from raytrain.clusters.profiles import LocalProfile
from raytrain.errors import ClusterError


class LocalRayCluster(Cluster):
    kind = "local"

    def __init__(self, options: ClusterOptions, profile: LocalProfile,
                 list_jobs: Callable[[], list[Any]] | None = None):
        self.options = options
        self.profile = profile
        self.list_jobs = list_jobs or (lambda: [])  # JobInfos of the cluster's jobs (given by the caller)

    def settings(self) -> dict[str, Any]:
        """`cluster up` flags over a `kind: local` profile over the defaults."""
        o, p = self.options, self.profile
        return {
            "num_cpus": o.num_cpus if o.num_cpus is not None else p.num_cpus,
            "num_gpus": o.num_gpus if o.num_gpus is not None else p.num_gpus,
            "port": o.port or p.port or local_head.default_port(),
            "dashboard_port": o.dashboard_port or p.dashboard_port or local_head.default_dashboard_port(),
        }

    def up(self, *, dry_run: bool = False) -> str:
        if dry_run:
            raise ClusterError("--dry-run: only with --k8s (a RayCluster manifest)")
        settings = self.settings()
        for flag, key in (("--num-cpus", "num_cpus"), ("--num-gpus", "num_gpus")):
            if settings[key] is not None and settings[key] < 0:
                raise ClusterError(f"{flag} {settings[key]:g}: must be >= 0")
        resources = ray_process.parse_resources(self.options.resources)
        node_ip = ray_process.check_node_ip(self.options.node_ip)
        c, started = local_head.up(**settings, node_ip=node_ip, resources=resources)
        verb = "started" if started else "already running"
        return (
            f"local Ray cluster {verb}: dashboard {c.dashboard_url}, GCS {c.gcs_address} (pid {c.pid})\n"
            f"{joined_node.token_hint(c.token_path, c.gcs_address)}\n"
        )

    def status(self) -> dict[str, Any]:
        """Nodes (CPUs, GPUs, memory, the jobs whose Ray Train workers run there) and running jobs."""
        c = local_head.current()
        if c is None:
            return {"running": False}
        dash = c.dashboard()
        nodes = ray_status.nodes_of(dash.node_summaries())
        # node["workers"]: the jobs whose Ray Train workers run there (None: the state API did not answer)
        workers_error = ray_status.add_worker_placement(dash, nodes)
        jobs = [j.to_dict() for j in self.list_jobs() if not j.state.terminal]
        return {
            "running": True,
            "dashboard": c.dashboard_url,
            "gcs_address": c.gcs_address,
            "token_path": c.token_path,  # what a Ray client of this cluster authenticates with (RAY_AUTH_TOKEN_PATH)
            "pid": c.pid,
            "nodes": nodes,
            "totals": {
                "cpus": sum(n["cpus"] for n in nodes),
                "gpus": sum(n["gpus"] for n in nodes),
                "memory_total_bytes": sum(n["memory_total_bytes"] for n in nodes),
            },
            "jobs": jobs,
            "workers_error": workers_error,
        }

    def jobs_in_use(self) -> list[str]:
        if local_head.current() is None:
            return []
        try:
            infos = self.list_jobs()
        except ClusterError:
            return []  # the head does not answer: nothing can be asked, `down` stops its process
        return [f"{i.job_id} ({i.name}, {i.state.value})" for i in infos if not i.state.terminal]

    def down(self) -> str:
        """Stop the local cluster (or the node `cluster join` started) and every job on it."""
        lines = []
        node = joined_node.down()
        if node is not None:
            lines.append(f"worker node stopped (was joined to {node.gcs_address})")
        c = local_head.down()
        if c is not None or node is None:
            lines.append("local Ray cluster stopped" if c else "no local Ray cluster is running")
        return "".join(line + "\n" for line in lines)
