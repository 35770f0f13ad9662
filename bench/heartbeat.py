"""The heartbeat's cost per training step: steady-step A/B with it on and off, in the same two processes.

    .venv/bin/python bench/heartbeat.py [--steps 200] [--rounds 5] [--dim 256]

Two CPU processes (gloo, as raytrain's CPU workers) build one DeepSpeed engine each (ZeRO 1, raytrain's
``build_engine``) over a small MLP and alternate, round by round, ``--steps`` steps with the heartbeat off
(the engine's own methods) and on (``heartbeat.instrument``'s phase marks around forward, backward and step,
``STATE.step_finished`` per step, and a beat thread that snapshots the state and serialises it every 0.1 s,
20 x the product's rate; the board call itself is a Ray RPC from that thread every 2 s and is not in the
figure). Prints the median step time of each side and on/off; the off side is this benchmark's switch, not
a product setting (the heartbeat has none).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def beat_loop(stop: threading.Event) -> None:
    from raytrain.runtime.worker import heartbeat

    while not stop.wait(0.1):
        pickle.dumps({**heartbeat.STATE.snapshot(), "rank": 0, "node": "x", "pid": os.getpid()})


def worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from raytrain.runtime.worker import heartbeat
    from raytrain.runtime.worker.engine import build_engine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, args.dim), nn.ReLU(), nn.Linear(args.dim, 1))
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
    engine = build_engine(model, optimizer=lambda p: torch.optim.SGD(list(p), lr=1e-3), config=config,
                          lr_scheduler=None, model_parameters=None)
    x, y = torch.randn(8, args.dim), torch.randn(8, 1)

    def run(on: bool) -> float:
        hooks = set(engine._forward_pre_hooks)
        stop = threading.Event()
        if on:
            heartbeat.instrument(engine)
            threading.Thread(target=beat_loop, args=(stop,), daemon=True).start()
        dist.barrier()
        times = []
        for step in range(args.steps):
            t = time.perf_counter()
            loss = ((engine(x) - y) ** 2).mean()
            engine.backward(loss)
            engine.step()
            if on:
                heartbeat.STATE.step_finished(step)
            times.append(time.perf_counter() - t)
        stop.set()
        for key in set(engine._forward_pre_hooks) - hooks:
            del engine._forward_pre_hooks[key]
        for name in ("backward", "step", "train_batch"):
            engine.__dict__.pop(name, None)
        return statistics.median(times[args.steps // 5:])

    result = {"off": [], "on": []}
    for r in range(args.rounds):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            result[side].append(run(side == "on"))
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def training_thread_cost_us(n: int = 200_000) -> float:
    """What the heartbeat adds to one step on the training thread, timed alone: a forward pre-hook's mark,
    the backward and step wrappers around a no-op, and step_finished; less the same calls unwrapped."""
    from raytrain.runtime.worker import heartbeat

    class Engine:
        def backward(self, loss):
            return loss

        def step(self):
            return None

        def register_forward_pre_hook(self, hook):
            self.hook = hook

    plain, marked = Engine(), heartbeat.instrument(Engine())

    def loop(fake, on):
        t = time.perf_counter()
        for i in range(n):
            if on:
                fake.hook(None, None)
                heartbeat.STATE.step_finished(i)
            fake.backward(i)
            fake.step()
        return time.perf_counter() - t

    return (min(loop(marked, True) for _ in range(3)) - min(loop(plain, False) for _ in range(3))) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--dim", type=int, default=256)
    args = p.parse_args()
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        mp.spawn(worker, args=(args, port, out), nprocs=2, join=True)
        result = json.loads(Path(out).read_text())
    off, on = statistics.median(result["off"]), statistics.median(result["on"])
    paired = statistics.median(a / b for a, b in zip(result["on"], result["off"]))
    marks = training_thread_cost_us()
    print(f"steady step, heartbeat off: {off * 1000:.3f} ms   on: {on * 1000:.3f} ms   on/off: {on / off:.4f}   "
          f"median of paired rounds: {paired:.4f}")
    print(f"training-thread work per step (3 phase marks through the wrappers + step_finished): {marks:.2f} us")
    print(json.dumps({"off_s": result["off"], "on_s": result["on"], "on_over_off": round(on / off, 4),
                      "paired_on_over_off": round(paired, 4), "marks_us_per_step": round(marks, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
