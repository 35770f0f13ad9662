"""One small model, one fixed data stream, any layout: the job of tests/e2e/test_equivalence.py (issue 20).

A residual MLP (blocks of ``fc1``/``fc2``, which AutoTP splits column/row by name, then a linear head) trained
with SGD on a regression target whose loss starts large, so that gradient clipping at 1.0 acts. Step s uses
the same global batch in every layout: sample i of step s is drawn from seed (s, i), and each data-parallel
rank takes its micro-batches' share of it. With ``--pp`` the same layers go through ``ctx.pipeline``.

Every step reports the global mean loss; the end reports ``probe_loss``, the loss of the final parameters on
a fixed probe batch (the final parameters, compared through what they compute, whatever their sharding), and
``block_forwards_per_micro``: how many times each of this rank's blocks ran forward per training micro-batch
(counted by forward pre-hooks on the engine's own modules): 1, or 2 where activation checkpointing recomputes it.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DIM = 32


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    """The layers in order; each block through ``ctx.activation_checkpointed`` (recomputed in backward under
    --activation-checkpointing)."""

    def __init__(self, parts, checkpointed):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.parts[:-1]:
            x = self.checkpointed(block, x)
        return self.parts[-1](x)


def layers(blocks: int = 4):
    torch.manual_seed(0)
    return [Block(DIM) for _ in range(blocks)] + [nn.Linear(DIM, 4)]


def loss_fn(out, y):
    return F.mse_loss(out.float(), y.float())


def samples(step: int, first: int, count: int):
    xs, ys = [], []
    for i in range(first, first + count):
        g = torch.Generator().manual_seed(step * 100_003 + i)
        xs.append(torch.randn(DIM, generator=g))
        ys.append(3.0 * torch.randn(4, generator=g))
    return torch.stack(xs), torch.stack(ys)


def micro_batches(ctx, step: int):
    """This rank's grad-accum micro-batches of step ``step``'s global batch (dp_rank-major)."""
    per_rank = ctx.micro_batch * ctx.grad_accum
    first = ctx.dp_rank * per_rank
    return [samples(step, first + m * ctx.micro_batch, ctx.micro_batch) for m in range(ctx.grad_accum)]


def world_mean(ctx, value):
    """The mean of ``value`` over the world (tensor-parallel ranks hold the same value: the world mean is the
    data-parallel mean)."""
    t = torch.tensor(float(value))
    dist.all_reduce(t)
    return float(t) / ctx.world_size


def data_parallel_step(ctx, engine, batches, loss_scale=None):
    """One step of a ``ctx.deepspeed`` engine over this rank's micro-batches; the global mean loss.
    ``loss_scale``: each micro-batch's loss times it (nonfinite.py's step that makes no update)."""
    total = 0.0
    for x, y in batches:
        loss = loss_fn(engine(x.to(ctx.device, ctx.dtype)), y.to(ctx.device))
        if loss_scale is not None:
            loss = loss * loss_scale
        engine.backward(loss)
        engine.step()
        total += float(loss)
    return world_mean(ctx, total / ctx.grad_accum)


def data_parallel_probe_loss(ctx, engine, probe):
    with torch.no_grad():
        return world_mean(ctx, loss_fn(engine(probe[0].to(ctx.device, ctx.dtype)), probe[1].to(ctx.device)))


def count_block_forwards(ctx, engine):
    """Counts the forwards of this rank's blocks; returns ``per_micro(steps)``: the count per block and training
    micro-batch so far (call it before any probe forward)."""
    forwards = [0]
    blocks = [m for m in engine.module.modules() if isinstance(m, Block)]
    for block in blocks:
        # a pre-hook: torch's non-reentrant recompute stops once it has what backward needs, before the
        # forward hooks would run
        block.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    return lambda steps: forwards[0] / (len(blocks) * steps * ctx.grad_accum)


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args(ctx.args)
    sgd = lambda params: torch.optim.SGD(list(params), lr=args.lr)  # noqa: E731
    probe = samples(10_000, 0, 8)
    if ctx.pp > 1:
        engine = ctx.pipeline(layers(), loss_fn, optimizer=sgd)

        def train_step(step):
            batches = [(x.to(ctx.dtype), y) for x, y in micro_batches(ctx, step)]
            return float(engine.train_batch(data_iter=iter(batches)))  # the global mean, on every stage

        def probe_loss():  # the pipeline's buffers have the micro-batch's shape: feed the probe in micro-batches
            m = ctx.micro_batch
            assert m * ctx.grad_accum == len(probe[0]), "the probe must be grad_accum micro-batches"
            chunks = [(probe[0][i:i + m].to(ctx.dtype), probe[1][i:i + m]) for i in range(0, len(probe[0]), m)]
            return float(engine.eval_batch(iter(chunks)))  # the mean over equal chunks: the probe's mean
    else:
        engine = ctx.deepspeed(Net(layers(), ctx.activation_checkpointed), optimizer=sgd)

        def train_step(step):
            return data_parallel_step(ctx, engine, micro_batches(ctx, step))

        def probe_loss():
            return data_parallel_probe_loss(ctx, engine, probe)

    forwards_per_micro = count_block_forwards(ctx, engine)
    for step in range(args.steps):
        metrics = {"loss": train_step(step)}
        if step + 1 == args.steps:
            metrics["block_forwards_per_micro"] = forwards_per_micro(args.steps)
            metrics["probe_loss"] = probe_loss()
        ctx.report(metrics)
