"""`raytrain gpus` without a cluster: the real no-GPU path, and the table from an NVML inventory."""
import json

from click.testing import CliRunner
from rich.console import Console

from raytrain.cli.gpus import gpu_table
from raytrain.cli.main import main


def test_no_gpu_on_this_machine_is_one_line_and_exit_0(raytrain_home):
    r = CliRunner().invoke(main, ["gpus"])
    assert r.exit_code == 0
    assert r.output.strip().startswith("no GPU on this machine") and len(r.output.strip().splitlines()) == 1
    data = json.loads(CliRunner().invoke(main, ["gpus", "--json"]).output)
    assert data["nodes"][0]["gpus"] == []


def test_gpu_table_shows_bandwidth_and_sms():
    node = {"hostname": "gpu-node-1", "gpus": [{
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total": 80 * 2**30, "memory_free": 79 * 2**30,
        "memory_bus_width_bits": 5120, "max_memory_clock_mhz": 2619, "bandwidth_gb_s": 3352.3, "sm_count": 132,
        "utilization_gpu": 7, "temperature_c": 31, "power_w": 71.5, "driver_version": "580.1", "cuda_version": "13.0",
    }]}
    console = Console(width=250, record=True)
    console.print(gpu_table([node]))
    text = console.export_text()
    for expected in ("gpu-node-1", "H100", "79.0/80.0 GiB", "5120-bit", "3352 GB/s", "132", "7%", "580.1", "13.0"):
        assert expected in text, expected
