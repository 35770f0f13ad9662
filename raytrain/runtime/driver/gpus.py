"""``python -m raytrain.runtime.driver.gpus``: a Ray task on every node reads its GPUs through NVML."""
from __future__ import annotations

import socket

from raytrain import events


def node_inventory() -> dict:
    from raytrain.nvml import gpu_inventory

    return {"hostname": socket.gethostname(), "gpus": gpu_inventory()}


def main() -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(log_to_driver=False)
    probe = ray.remote(num_cpus=0)(node_inventory)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes
    ]
    results = ray.get(refs, timeout=60)
    inventory = [
        {"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress", ""), **r} for n, r in zip(nodes, results)
    ]
    events.emit("gpus", nodes=inventory)
    return 0


if __name__ == "__main__":
    from raytrain.runtime.driver.process_exit import exit_without_finalizing

    exit_without_finalizing(main())
