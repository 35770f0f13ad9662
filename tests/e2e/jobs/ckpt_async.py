"""The job of tests/e2e/test_async_checkpoints.py: a small MLP (AdamW, fp32), a fixed data stream (step s's
batch is a function of s and the data-parallel rank), checkpoints by --checkpoint-every, and at the end rank 0
saves the gathered parameters (--params-out) so two runs can be compared tensor by tensor.

Test handshakes (only on a run that was not restored, so a restart runs clean):
``--slow-upload STEP:SECONDS`` (repeatable): every rank holds the writing of step STEP's checkpoint SECONDS on
the upload thread (raytrain.runtime.checkpoint.async_save.BEFORE_WRITE), while training goes on.
``--sigkill-at-step N --hold-upload-step M``: rank 1 holds its step-M upload; after step N's report rank 0
waits until its own step-M files are in storage, then rank 1 (whose upload is still held) is SIGKILLed.
``--crash-after-step N``: after step N's report every rank waits until the save in flight is committed, then
rank 1 exits: the restart resumes from that checkpoint (written while training went on).
"""
import argparse
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--params-out", default="")
    p.add_argument("--slow-upload", action="append", default=[])
    p.add_argument("--sigkill-at-step", type=int, default=0)
    p.add_argument("--hold-upload-step", type=int, default=0)
    p.add_argument("--crash-after-step", type=int, default=0)
    return p


# --tp: the two Linear layers of model(), split column then row (a plain nn.Sequential has no role names)
TP_SPEC = {"layer_specs": [{"patterns": [r"(.*\.)?0\.weight$"], "partition_type": "column"},
                           {"patterns": [r"(.*\.)?2\.weight$"], "partition_type": "row"}]}


def model(args=None):
    a = parser().parse_args(list(args or []))
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(a.dim, 4 * a.dim), nn.ReLU(), nn.Linear(4 * a.dim, a.dim))


def batch(step, rank, n, dim):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(n, dim, generator=g)
    return x, torch.tanh(x.flip(-1))


def install_hooks(ctx, args):
    from raytrain.runtime.checkpoint import async_save as async_checkpoint

    holding = threading.Event()
    slow = dict(tuple(float(v) for v in spec.split(":")) for spec in args.slow_upload)

    def hook(step, rank):
        if step in slow:
            print(f"rank {rank}: holding the upload of step {step} for {slow[step]:g} s", flush=True)
            time.sleep(slow[step])
        if args.hold_upload_step and step == args.hold_upload_step and rank == 1:
            print(f"rank {rank}: holding the upload of step {step} until this process is killed", flush=True)
            holding.set()
            time.sleep(120)  # bounded: the test kills this process long before

    if ctx.resumed_from is None:
        async_checkpoint.BEFORE_WRITE.append(hook)
    return holding


def sigkill_mid_upload(ctx, args, holding):
    """Rank 0's step-M files reach storage, rank 1's are held: rank 1 dies by SIGKILL."""
    if ctx.rank == 0:
        deadline = time.monotonic() + 60
        flight = ctx._checkpoints._async.current
        while flight is not None and flight.upload_s is None and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        assert holding.wait(60), "rank 1's upload was never held"
    dist.barrier()
    if ctx.rank == 1:
        print(f"rank 1: SIGKILL while the checkpoint of step {args.hold_upload_step} is uploading", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def train(ctx):
    args = parser().parse_args(ctx.args)
    engine = ctx.deepspeed(model(ctx.args), lr=args.lr)
    holding = install_hooks(ctx, args)  # after the restore: ctx.resumed_from says whether this is a restart
    for step in range(ctx.start_step, args.steps):
        x, y = batch(step, ctx.dp_rank, ctx.micro_batch, args.dim)
        loss = F.mse_loss(engine(x.to(ctx.device)), y.to(ctx.device))
        engine.backward(loss)
        engine.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        ctx.report({"loss": float(t) / ctx.world_size})
        if step + 1 == args.sigkill_at_step and ctx.resumed_from is None:
            sigkill_mid_upload(ctx, args, holding)
        if step + 1 == args.crash_after_step and ctx.resumed_from is None:
            ctx._checkpoints.wait_in_flight()
            dist.barrier()
            if ctx.rank == 1:
                print(f"rank 1: crash after step {step + 1}", flush=True)
                os._exit(1)
    if args.params_out:
        import deepspeed

        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params):  # ZeRO-3: whole tensors; a no-op below
            if ctx.rank == 0:
                torch.save({n: p.detach().clone() for n, p in engine.module.named_parameters()}, args.params_out)
