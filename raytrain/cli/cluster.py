"""`raytrain cluster up|status|down`: the embedded local Ray cluster."""
from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from raytrain.cli import k8s as k8s_cli
from raytrain.cli.cluster_join import join
from raytrain.cli.common import handle_errors, print_json
from raytrain.errors import ClusterError
from raytrain.clusters import joined_node, local_head, ray_process


@click.group()
def cluster():
    """The embedded single-node Ray cluster (dashboard on 127.0.0.1, token auth), or with --k8s a KubeRay
    RayCluster on Kubernetes."""


@cluster.command()
@click.option("--num-cpus", type=float, help="CPUs the cluster offers (default: all).")
@click.option("--num-gpus", type=float, help="GPUs the cluster offers (default: all visible).")
@click.option("--port", type=int, help=f"GCS port (default {local_head.DEFAULT_PORT}).")
@click.option("--dashboard-port", type=int, help=f"Default {local_head.DEFAULT_DASHBOARD_PORT}.")
@click.option("--node-ip", help="This machine's address for Ray (other machines join via it). Default: loopback.")
@click.option("--resources", "resources_json", help='Custom resources of this node as JSON: \'{"node_a": 1}\'.')
@k8s_cli.cluster_options
@click.option("--dry-run", is_flag=True, help="k8s: print the RayCluster manifest (YAML); apply nothing.")
@handle_errors
def up(num_cpus, num_gpus, port, dashboard_port, node_ip, resources_json, dry_run, **k8s):
    """Start the local cluster (no-op if it runs); --k8s: create or update the RayCluster (server-side apply)."""
    if k8s_cli.wants_k8s(k8s):
        k8s_cli.refuse_local_flags(
            num_cpus=num_cpus, num_gpus=num_gpus, port=port, dashboard_port=dashboard_port,
            node_ip=node_ip, resources=resources_json,
        )
        return k8s_cli.cluster_up(k8s, dry_run=dry_run)
    if dry_run:
        raise ClusterError("--dry-run: only with --k8s (a RayCluster manifest)")
    args = k8s_cli.local_up_args(k8s, num_cpus, num_gpus, port, dashboard_port)
    num_cpus, num_gpus, port, dashboard_port = args["num_cpus"], args["num_gpus"], args["port"], args["dashboard_port"]
    for flag, value in (("--num-cpus", num_cpus), ("--num-gpus", num_gpus)):
        if value is not None and value < 0:
            raise ClusterError(f"{flag} {value:g}: must be >= 0")
    resources = ray_process.parse_resources(resources_json)
    node_ip = ray_process.check_node_ip(node_ip)
    c, started = local_head.up(
        num_cpus=num_cpus, num_gpus=num_gpus, port=port, dashboard_port=dashboard_port,
        node_ip=node_ip, resources=resources,
    )
    verb = "started" if started else "already running"
    click.echo(f"local Ray cluster {verb}: dashboard {c.dashboard_url}, GCS {c.gcs_address} (pid {c.pid})")
    click.echo(joined_node.token_hint(c.token_path, c.gcs_address))


@cluster.command()
@k8s_cli.cluster_options
@handle_errors
def down(**k8s):
    """Stop the local cluster (or the node `cluster join` started) and every job on it; --k8s: delete the
    RayCluster."""
    if k8s_cli.wants_k8s(k8s):
        return k8s_cli.cluster_down(k8s)
    node = joined_node.down()
    if node is not None:
        click.echo(f"worker node stopped (was joined to {node.gcs_address})")
    c = local_head.down()
    if c is not None or node is None:
        click.echo("local Ray cluster stopped" if c else "no local Ray cluster is running")


cluster.add_command(join)


def cluster_report() -> dict:
    from raytrain.clusters import ray_status
    from raytrain.targets.local import LocalTarget

    c = local_head.current()
    if c is None:
        return {"running": False}
    dash = c.dashboard()
    nodes = ray_status.nodes_of(dash.node_summaries())
    # node["workers"]: the jobs whose Ray Train workers run there (None: the state API did not answer)
    workers_error = ray_status.add_worker_placement(dash, nodes)
    jobs = [j.to_dict() for j in LocalTarget().list() if not j.state.terminal]
    return {
        "running": True,
        "dashboard": c.dashboard_url,
        "gcs_address": c.gcs_address,
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


@cluster.command()
@click.option("--json", "as_json", is_flag=True)
@k8s_cli.cluster_options
@handle_errors
def status(as_json, **k8s):
    """Nodes (CPUs, GPUs, memory, the jobs whose Ray Train workers run there) and running jobs of the local
    cluster; --k8s: the RayCluster's status."""
    if k8s_cli.wants_k8s(k8s):
        return k8s_cli.cluster_status(k8s, as_json)
    from raytrain.clusters.ray_status import workers_cell

    report = cluster_report()
    if as_json:
        print_json(report)
        return
    if not report["running"]:
        click.echo("no local Ray cluster is running (start one: raytrain cluster up)")
        return
    console = Console()
    console.print(f"local Ray cluster: dashboard {report['dashboard']}, GCS {report['gcs_address']}")
    table = Table("node", "id", "ip", "head", "CPUs", "GPUs", "memory (GiB avail/total)", "CPU %", "Train workers")
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
    console.print(table)
    if report["workers_error"]:
        console.print(f"worker placement unavailable: {report['workers_error']}", markup=False)
    if report["jobs"]:
        jobs = Table("job", "name", "state")
        for j in report["jobs"]:
            jobs.add_row(j["id"], j["name"], j["state"])
        console.print(jobs)
    else:
        console.print("no running jobs")
