"""A job whose steps each do about --work-ms of work on every rank; rank --slow-rank also sleeps that long in
each step from step --slow-from to --slow-until (2x slower): the straggler watch's job (tests/e2e/test_straggler.py).
``--dump-compute``: every rank prints its measured compute times at the end (``@@compute {"rank", "compute"}``),
the recorded timings the detector's unit test replays."""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--work-ms", type=float, default=60.0)
    p.add_argument("--slow-rank", type=int, default=-1)  # -1: no rank is slowed
    p.add_argument("--slow-from", type=int, default=10)
    p.add_argument("--slow-until", type=int, default=1 << 30)  # it recovers from this step on
    p.add_argument("--dump-compute", action="store_true")
    args = p.parse_args(ctx.args)
    torch.manual_seed(0)
    engine = ctx.deepspeed(nn.Linear(8, 1), optimizer=lambda params: torch.optim.SGD(list(params), lr=0.01))
    a = torch.randn(32, 32)
    from raytrain.runtime.worker import heartbeat

    measured = {}
    for step in range(ctx.start_step, args.steps):
        start = time.perf_counter()
        while (time.perf_counter() - start) * 1000 < args.work_ms:  # the step's own work
            a = torch.tanh(a @ a)
        if ctx.rank == args.slow_rank and args.slow_from <= step < args.slow_until:
            time.sleep(args.work_ms / 1000)  # as long again: this rank is 2x slower
        g = torch.Generator().manual_seed(step * 1000 + ctx.rank)
        x = torch.randn(4, 8, generator=g)
        loss = F.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        ctx.report({"loss": loss.item(), "step": step + 1})
        if args.dump_compute and heartbeat.STATE.compute:  # the heartbeat keeps the last 256: note each one
            done, seconds = heartbeat.STATE.compute[-1]
            measured[done] = seconds
    if args.dump_compute:
        sys.stdout.write("@@compute " + json.dumps({"rank": ctx.rank, "compute": sorted(measured.items())}) + "\n")
        sys.stdout.flush()
