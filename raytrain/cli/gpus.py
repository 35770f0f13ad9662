"""`raytrain gpus`: every GPU of the cluster (NVML on each node), or of this machine without a cluster."""
from __future__ import annotations

import click
from rich.table import Table

from raytrain.cli.common import address_option, handle_errors, print_json, print_table
from raytrain.targets.factory import TargetOptions, make_target


def _fmt(value, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value / scale:.{digits}f}{unit}"


def gpu_table(nodes: list[dict]) -> Table:
    table = Table(
        "node", "#", "name", "memory free/total", "bus", "max mem clock", "bandwidth", "SMs", "util",
        "temp", "power", "driver", "CUDA",
    )
    for node in nodes:
        for g in node["gpus"]:
            table.add_row(
                node.get("hostname") or node.get("ip", ""),
                str(g.get("index", "")),
                g.get("name") or "-",
                f"{_fmt(g.get('memory_free'), '', 2**30, 1)}/{_fmt(g.get('memory_total'), ' GiB', 2**30, 1)}",
                _fmt(g.get("memory_bus_width_bits"), "-bit"),
                _fmt(g.get("max_memory_clock_mhz"), " MHz"),
                _fmt(g.get("bandwidth_gb_s"), " GB/s"),
                _fmt(g.get("sm_count")),
                _fmt(g.get("utilization_gpu"), "%"),
                _fmt(g.get("temperature_c"), " C"),
                _fmt(g.get("power_w"), " W"),
                g.get("driver_version") or "-",
                g.get("cuda_version") or "-",
            )
    return table


@click.command()
@address_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def gpus(address, as_json):
    """Inventory of every GPU in the cluster: memory, bandwidth, SMs, utilisation, temperature, power."""
    target = make_target(TargetOptions(address=address), auto_start=False)
    if not target.running():  # local, not running: this machine is the cluster
        import socket

        from raytrain.nvml import gpu_inventory

        nodes = [{"hostname": socket.gethostname(), "ip": "127.0.0.1", "gpus": gpu_inventory()}]
        where = "this machine (no local cluster is running)"
    else:
        nodes = target.run_utility("raytrain.runtime.driver.gpus", "gpus")["nodes"]
        where = f"the cluster at {target.address}"
    if as_json:
        print_json({"nodes": nodes})
        return
    count = sum(len(n["gpus"]) for n in nodes)
    if count == 0:
        click.echo(f"no GPU on {where} ({len(nodes)} node(s)); CPU workers use --gpus-per-worker 0")
        return
    print_table(gpu_table(nodes))
