"""bench/overhead.py --guards-ab --same-processes: every guard on vs off in the same two processes.

Two CPU processes (gloo, as raytrain's CPU workers) each build two DeepSpeed engines (raytrain's
``build_engine``, ZeRO --zero, fp32) over the same MLP: one as raytrain builds it (the non-finite guard
installed, ``heartbeat.instrument``'s phase marks), one without either. Rounds of --steps steps alternate
(off, on, on, off, ...); an "on" round also has the straggler watch's compute timing (``Work.wait`` timed,
``STATE.step_finished`` per step) and a beat thread that every heartbeat.BEAT_S snapshots the state and runs
the straggler rule on it (in a raytrain job the board and the watchdog are other processes: this is an upper
bound). An "off" round puts torch's own ``Work.wait`` back. Alternating inside the same processes keeps
machine load that drifts over minutes out of the ratio. Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def worker(rank: int, a: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.distributed_c10d import Work

    from raytrain import straggler
    from raytrain.runtime.worker import collective_time, guard, heartbeat
    from raytrain.runtime.worker.engine import build_engine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dim, layers, batch = a["dim"], a["layers"], a["batch"]

    def model():
        torch.manual_seed(0)
        blocks = [m for _ in range(layers) for m in (nn.Linear(dim, dim), nn.GELU())]
        return nn.Sequential(*blocks, nn.Linear(dim, 1))

    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": a["zero"]}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}

    def engine(guarded: bool):
        install = guard.install
        if not guarded:
            guard.install = lambda engine, **kw: None
        try:
            built = build_engine(model(), optimizer=lambda p: torch.optim.AdamW(list(p), lr=1e-4), config=config,
                                 lr_scheduler=None, model_parameters=None)
        finally:
            guard.install = install
        return heartbeat.instrument(built) if guarded else built

    plain, guarded = engine(False), engine(True)
    torch_wait = Work.wait
    collective_time.install()
    timed_wait = Work.wait
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, dim, generator=g), torch.randn(batch, 1, generator=g)
    step_no = [0]

    def run(on: bool) -> float:
        Work.wait = timed_wait if on else torch_wait
        heartbeat.STATE.timing = on
        stop = threading.Event()
        if on:
            detector = straggler.Detector()

            def beat() -> None:
                while not stop.wait(heartbeat.BEAT_S):
                    snap = heartbeat.STATE.snapshot()
                    detector.update([{**snap, "rank": 0}, {**snap, "rank": 1}])

            threading.Thread(target=beat, daemon=True).start()
        eng = guarded if on else plain
        dist.barrier()
        times = []
        for _ in range(a["steps"]):
            t = time.perf_counter()
            loss = ((eng(x) - y) ** 2).mean()
            eng.backward(loss)
            eng.step()
            step_no[0] += 1
            if on:
                heartbeat.STATE.step_finished(step_no[0])
            times.append(time.perf_counter() - t)
        stop.set()
        return statistics.median(times[a["steps"] // 5:])

    result = {"off": [], "on": []}
    run(True), run(False)  # warm-up, not counted
    for r in range(a["rounds"]):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            result[side].append(run(side == "on"))
    Work.wait = torch_wait
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(*, zero: int, steps: int, rounds: int, dim: int, layers: int, batch: int) -> dict:
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = {"zero": zero, "steps": steps, "rounds": rounds, "dim": dim, "layers": layers, "batch": batch}
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        mp.spawn(worker, args=(a, port, out), nprocs=2, join=True)
        result = json.loads(Path(out).read_text())
    off, on = statistics.median(result["off"]), statistics.median(result["on"])
    paired = [x / y for x, y in zip(result["on"], result["off"])]
    return {**a, "steady_on_s": on, "steady_off_s": off, "ratio": on / off, "paired_ratio": statistics.median(paired),
            "round_ratios": paired, "on_s": result["on"], "off_s": result["off"]}
