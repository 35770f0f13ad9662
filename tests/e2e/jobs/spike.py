"""The job of tests/e2e/test_spike.py: a linear model trained for one epoch of ``--data train=...`` rows
{"id", "x", "y"} (plain SGD, no shuffle), one optimizer step per micro-batch.

``--spike-ids A,B``: a rank's loss is multiplied by 1000 for a batch that holds one of those ids (a loss spike
at one global batch; its update would ruin the weights). The last step reports the final parameters
in a ``@@params {"params", "step", "skipped_steps"}`` line.
"""
import argparse
import json

import torch
import torch.nn.functional as F


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--spike-ids", default="")
    args = p.parse_args(ctx.args)
    spike = {int(i) for i in args.spike_ids.split(",") if i}
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    engine = ctx.deepspeed(model, torch.optim.SGD(model.parameters(), lr=0.05))
    step = ctx.start_step
    for batch in ctx.dataset("train"):  # the epoch (its rest, when restored)
        loss = F.mse_loss(engine(batch["x"].float()).squeeze(-1), batch["y"].float())
        if spike & set(batch["id"].tolist()):
            loss = loss * 1000.0
        engine.backward(loss)
        engine.step()
        step += 1
        ctx.report({"loss": loss.item(), "step": step})
    params = torch.cat([q.detach().flatten() for q in engine.module.parameters()]).tolist()
    if ctx.is_main:
        print("@@params " + json.dumps({"params": params, "step": step, "skipped_steps": engine.skipped_steps}),
              flush=True)
