"""`raytrain cluster up|status|down`: the embedded local Ray cluster, or a KubeRay RayCluster (--k8s)."""
from __future__ import annotations

import sys
from typing import Any, Callable

import click
from rich.table import Table

from raytrain.cli.cluster_join import join
from raytrain.cli.common import FINITE_FLOAT, handle_errors, k8s_connection_options, output_console, print_json, print_table, with_options
from raytrain.clusters.base import ClusterOptions
from raytrain.clusters.factory import make_cluster
from raytrain.errors import ClusterError

# Which cluster: `cluster up|status|down [--k8s] [--profile FILE] [--cluster NAME] [--namespace NS]`; `--name` is the
# older spelling of `--cluster` (submit and jobs name the same RayCluster `--cluster`).
cluster_options = with_options(
    click.option("--k8s", "k8s", is_flag=True, help="A KubeRay RayCluster instead of the local cluster."),
    click.option("--profile", "k8s_profile", type=click.Path(), metavar="FILE",
                 help="Cluster profile (cluster/local.yaml, cluster/k8s-example.yaml)."),
    click.option("--cluster", "--name", "k8s_name", metavar="NAME",
                 help="k8s: RayCluster name, as submit's --cluster (default: the profile's, 'raytrain')."),
    k8s_connection_options,
)


def _local_jobs() -> list:
    from raytrain.targets.local import LocalTarget

    return LocalTarget(auto_start=False).list()


def _cluster(flags: dict[str, Any], **local: Any):
    return make_cluster(ClusterOptions(
        k8s=bool(flags.get("k8s")),
        profile=flags.get("k8s_profile"),
        name=flags.get("k8s_name"),
        namespace=flags.get("k8s_namespace"),
        context=flags.get("k8s_context"),
        kubeconfig=flags.get("k8s_kubeconfig"),
        **local,
    ), _local_jobs)


@click.group()
def cluster():
    """The embedded single-node Ray cluster (dashboard on 127.0.0.1, token auth), or with --k8s a KubeRay
    RayCluster on Kubernetes."""


@cluster.command()
@click.option("--num-cpus", type=FINITE_FLOAT, help="CPUs the cluster offers (default: all).")
@click.option("--num-gpus", type=FINITE_FLOAT, help="GPUs the cluster offers (default: all visible).")
@click.option("--port", type=int, help="GCS port (default 6379, or $RAYTRAIN_PORT).")
@click.option("--dashboard-port", type=int, help="Default 8265, or $RAYTRAIN_DASHBOARD_PORT.")
@click.option("--node-ip", help="This machine's address for Ray (other machines join via it). Default: every Ray "
              "process (GCS, raylet, object manager, dashboard) listens on 127.0.0.1 only, unreachable from other "
              "machines.")
@click.option("--resources", "resources_json", help='Custom resources of this node as JSON: \'{"node_a": 1}\'.')
@cluster_options
@click.option("--dry-run", is_flag=True, help="k8s: print the RayCluster manifest (YAML); apply nothing.")
@handle_errors
def up(num_cpus, num_gpus, port, dashboard_port, node_ip, resources_json, dry_run, **flags):
    """Start the local cluster (no-op if it runs); --k8s: create or update the RayCluster (server-side apply).

    The local cluster is single-node and bound to loopback (127.0.0.1) unless --node-ip is given; its ports
    must be free, and each start makes a new auth token."""
    c = _cluster(flags, num_cpus=num_cpus, num_gpus=num_gpus, port=port, dashboard_port=dashboard_port,
                 node_ip=node_ip, resources=resources_json)
    click.echo(c.up(dry_run=dry_run), nl=False)


def _can_ask() -> bool:
    """A person at a terminal can answer a question (not a script, not CI)."""
    return sys.stdin.isatty()


@cluster.command()
@click.option("--force", is_flag=True, help="Stop it even while jobs run on it (they are stopped with it).")
@cluster_options
@handle_errors
def down(force, **flags):
    """Stop the local cluster (or the node `cluster join` started) and every job on it; --k8s: delete the
    RayCluster (only one raytrain made). While jobs run on it, lists them and asks (--force: does not ask;
    without a terminal to ask on, refuses)."""
    c = _cluster(flags)
    jobs = [] if force else c.jobs_in_use()
    if jobs:
        click.echo(f"{len(jobs)} job(s) still run on this cluster and would be stopped:")
        for line in jobs:
            click.echo(f"  {line}")
        if not _can_ask():
            raise ClusterError("cluster down: jobs still run on it; give --force to stop them with the cluster")
        if not click.confirm("Stop them and the cluster?", default=False):
            raise ClusterError("cluster down: nothing stopped")
    click.echo(c.down(), nl=False)


cluster.add_command(join)


@cluster.command()
@click.option("--json", "as_json", is_flag=True)
@cluster_options
@handle_errors
def status(as_json, **flags):
    """Nodes (CPUs, GPUs, memory, the jobs whose Ray Train workers run there) and running jobs of the local
    cluster; --k8s: the RayCluster's status."""
    c = _cluster(flags)
    report = c.status()
    if as_json:
        print_json(report)
        return
    PRINT_STATUS[c.kind](report)


def _print_local_status(report: dict) -> None:
    from raytrain.clusters.ray_status import workers_cell

    if not report["running"]:
        click.echo("no local Ray cluster is running (start one: raytrain cluster up)")
        return
    console = output_console()
    console.print(f"local Ray cluster: dashboard {report['dashboard']}, GCS {report['gcs_address']}")
    table = Table("node", "id", "ip", "head", "CPUs", "GPUs", "memory GiB(avail/total)", "CPU%", "Train workers")
    for n in report["nodes"]:
        table.add_row(
            n["hostname"] or "",
            n["node_id"][:8],
            n["ip"] or "",
            "yes" if n["head"] else "",
            f"{n['cpus']:g}",
            f"{n['gpus']:g}",
            f"{n['memory_available_bytes'] / 2**30:.1f}/{n['memory_total_bytes'] / 2**30:.1f}",
            f"{n['cpu_percent'] or 0:.0f}",
            workers_cell(n),
        )
    print_table(table, console)
    if report["workers_error"]:
        console.print(f"worker placement unavailable: {report['workers_error']}", markup=False)
    if report["jobs"]:
        jobs = Table("job", "name", "state")
        for j in report["jobs"]:
            jobs.add_row(j["id"], j["name"], j["state"])
        print_table(jobs, console)
    else:
        console.print("no running jobs")


def _print_raycluster_status(report: dict) -> None:
    if not report["exists"]:
        click.echo(
            f"no RayCluster {report['name']!r} in namespace {report['namespace']} (create it: raytrain cluster up --k8s)"
        )
        return
    workers = report["available_workers"]
    desired = report["desired_workers"]
    click.echo(f"RayCluster {report['namespace']}/{report['name']}: {report['state']}"
               + (f" ({report['reason']})" if report["reason"] else ""))
    if desired is not None or workers is not None:
        click.echo(f"  workers   {workers if workers is not None else '?'}/{desired if desired is not None else '?'} available")
    for g in report["worker_groups"]:
        limits = ", ".join(f"{k} {v}" for k, v in g["limits"].items())
        click.echo(f"  group     {g['name']}: {g['replicas']} x ({limits})")
    click.echo(f"  capacity  {report['totals']['cpus']:g} CPU, {report['totals']['gpus']:g} GPU (Ray's view at full size)")
    click.echo(f"  head      svc/{report['head_service']} (ClusterIP), dashboard port {report['dashboard_port']}")
    if report["storage"]:
        click.echo(f"  storage   {report['storage']}")


# How a person reads each kind of cluster's status report (the library chose the cluster).
PRINT_STATUS: dict[str, Callable[[dict], None]] = {"local": _print_local_status, "kuberay": _print_raycluster_status}
