"""bench/checkpoint.py's job: an MLP whose parameters, gradients and AdamW state make a checkpoint of about
``--mparams`` x 12 bytes per rank (ZeRO 0: parameters + Adam's two moments, fp32), a cheap step, a checkpoint
every ``--checkpoint-every`` steps. Rank 0 times each step on the training thread, from its start to the end of
``ctx.report`` (where a save happens), and writes the times and the saved steps as JSON to ``--times-out``."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--mparams", type=float, default=10.0)
    p.add_argument("--times-out", default="")
    args = p.parse_args(ctx.args)
    width = 256
    depth = max(1, int(args.mparams * 1e6 / (width * width)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
    engine = ctx.deepspeed(model, lr=1e-4)
    times, saved, losses = [], [], []
    for step in range(ctx.start_step, args.steps):
        started = time.perf_counter()
        g = torch.Generator().manual_seed(step * 1000 + ctx.dp_rank)
        x = torch.randn(ctx.micro_batch, width, generator=g)
        loss = F.mse_loss(engine(x), x)
        engine.backward(loss)
        engine.step()
        due = ctx.checkpoint_every and (step + 1) % ctx.checkpoint_every == 0
        ctx.report({"loss": float(loss)})
        times.append(time.perf_counter() - started)
        saved.append(bool(due))
        losses.append(float(loss))
    if ctx.is_main and args.times_out:
        state_bytes = sum(p.numel() * p.element_size() * 3 for p in model.parameters())  # params + 2 moments
        with open(args.times_out, "w") as f:
            json.dump({"step_s": times, "saved": saved, "losses": losses, "state_bytes": state_bytes}, f)
