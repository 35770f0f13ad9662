"""A job whose rank 1 stops making progress (``stuck_loader``, a data loader that never returns) before step
HANG_AT on the first attempt only (a run restored from a checkpoint goes on): the hang watchdog's job
(tests/e2e/test_hang.py). Step s's data depends on (s, rank) only, so a restarted run computes what a clean
one does; the last report carries every parameter (``params``)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def stuck_loader():
    while True:
        time.sleep(3600)  # the line the watchdog names


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--hang-at", type=int, default=5)  # -1: never
    args = p.parse_args(ctx.args)
    torch.manual_seed(0)
    engine = ctx.deepspeed(nn.Linear(8, 1), optimizer=lambda params: torch.optim.SGD(list(params), lr=0.05))
    for step in range(ctx.start_step, args.steps):
        if step == args.hang_at and ctx.rank == 1 and ctx.resumed_from is None:
            stuck_loader()
        g = torch.Generator().manual_seed(step * 1000 + ctx.rank)
        x = torch.randn(4, 8, generator=g)
        loss = F.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        metrics = {"loss": loss.item(), "step": step + 1}
        if step + 1 == args.steps:
            metrics["params"] = [float(v) for v in torch.cat([q.detach().flatten() for q in engine.module.parameters()])]
        ctx.report(metrics)
