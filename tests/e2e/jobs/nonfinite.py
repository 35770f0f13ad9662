"""The job of tests/e2e/test_guard.py: tests/e2e/jobs/layouts.py's model and data stream, with one bad step.

``--bad-step S`` (0-based; the step reported as S+1) and ``--bad``:
- ``inf``: global sample 7 of that step's batch has an ``inf`` input (rank 1's with 2 data-parallel ranks; the
  one pipeline's under --pp 2, whose last stage, rank 1, computes the loss);
- ``zero``: that step's loss times 0 on every rank: a clean run in which that step makes no update (plain SGD);
- ``report-nan``: the job itself reports ``loss nan`` at its last step (no guard can skip a number the job makes).
Each step reports the global mean loss; the last also ``probe_loss`` (the final parameters, through what they
compute on a fixed batch), ``skipped_steps`` (the engine's count) and ``block_forwards_per_micro`` (as
layouts.py).
"""
import argparse
import math

import torch

from layouts import (Net, count_block_forwards, data_parallel_probe_loss, data_parallel_step, layers, loss_fn,
                     samples)


def micro_batches(ctx, step, bad_step, bad):
    per_rank = ctx.micro_batch * ctx.grad_accum
    out = []
    for m in range(ctx.grad_accum):
        first = ctx.dp_rank * per_rank + m * ctx.micro_batch
        x, y = samples(step, first, ctx.micro_batch)
        if bad == "inf" and step == bad_step and first <= 7 < first + ctx.micro_batch:
            x[7 - first, 0] = float("inf")
        out.append((x, y))
    return out


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bad-step", type=int, default=5)
    p.add_argument("--bad", choices=["inf", "zero", "report-nan", "none"], default="inf")
    args = p.parse_args(ctx.args)
    sgd = lambda params: torch.optim.SGD(list(params), lr=args.lr)  # noqa: E731
    probe = samples(10_000, 0, 8)
    if ctx.pp > 1:
        assert args.bad != "zero", "--bad zero is the data-parallel reference"
        engine = ctx.pipeline(layers(), loss_fn, optimizer=sgd)

        def train_step(step):
            batches = [(x.to(ctx.dtype), y) for x, y in micro_batches(ctx, step, args.bad_step, args.bad)]
            return float(engine.train_batch(data_iter=iter(batches)))

        def probe_loss():
            m = ctx.micro_batch
            chunks = [(probe[0][i:i + m].to(ctx.dtype), probe[1][i:i + m]) for i in range(0, len(probe[0]), m)]
            return float(engine.eval_batch(iter(chunks)))
    else:
        engine = ctx.deepspeed(Net(layers(), ctx.checkpointed), optimizer=sgd)

        def train_step(step):
            zero = args.bad == "zero" and step == args.bad_step
            return data_parallel_step(ctx, engine, micro_batches(ctx, step, args.bad_step, args.bad),
                                      loss_scale=0.0 if zero else None)

        def probe_loss():
            return data_parallel_probe_loss(ctx, engine, probe)

    forwards_per_micro = count_block_forwards(ctx, engine)
    for step in range(args.steps):
        metrics = {"loss": train_step(step)}
        if step + 1 == args.steps:
            metrics["block_forwards_per_micro"] = forwards_per_micro(args.steps)
            metrics["probe_loss"] = probe_loss()
            metrics["skipped_steps"] = engine.skipped_steps
            if args.bad == "report-nan":
                metrics["loss"] = math.nan
        ctx.report(metrics)
