"""`raytrain cluster join GCS_ADDRESS --token-file PATH`: this machine as a worker node of a head elsewhere."""
from __future__ import annotations

import click

from raytrain.cli.common import FINITE_FLOAT, handle_errors
from raytrain.clusters import joined_node, ray_process
from raytrain.errors import ConfigError


@click.command()
@click.argument("gcs_address")
@click.option("--token-file", required=True, help="A copy of the head's auth token (`cluster up` prints its path).")
@click.option("--num-cpus", type=FINITE_FLOAT, help="CPUs this node offers (default: all).")
@click.option("--num-gpus", type=FINITE_FLOAT, help="GPUs this node offers (default: all visible).")
@click.option("--node-ip", help="This machine's address for Ray (default: the one that routes to the head).")
@click.option("--resources", "resources_json", help='Custom resources of this node as JSON: \'{"node_b": 1}\'.')
@click.option(
    "--timeout", "timeout_s", type=FINITE_FLOAT, default=joined_node.JOIN_TIMEOUT_S, show_default=True,
    help="Seconds to wait until the head lists this node.",
)
@handle_errors
def join(gcs_address, token_file, num_cpus, num_gpus, node_ip, resources_json, timeout_s):
    """Start a Ray worker node joined to the head at GCS_ADDRESS (HOST:PORT, as `cluster up --node-ip` prints)
    and wait until the head lists it. It keeps running after this returns; stop it with `raytrain cluster down`."""
    for flag, value in (("--num-cpus", num_cpus), ("--num-gpus", num_gpus)):
        if value is not None and value < 0:
            raise ConfigError(f"{flag} {value:g}: must be >= 0", flag=flag)
    resources = ray_process.parse_resources(resources_json)
    node_ip = ray_process.check_node_ip(node_ip)
    node, started = joined_node.join(
        gcs_address, token_file=token_file, num_cpus=num_cpus, num_gpus=num_gpus, node_ip=node_ip,
        resources=resources, timeout_s=timeout_s,
    )
    verb = "joined" if started else "already joined"
    click.echo(f"worker node {verb} {node.gcs_address} (pid {node.pid}; log {node.log_path})")
