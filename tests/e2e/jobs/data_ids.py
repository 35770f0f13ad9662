"""The job of tests/e2e/test_data.py: a linear model trained on ``--data train=...`` rows {"id", "x", "y"}.

Every micro-batch's sample ids are written to the log (``@@ids {"rank", "step", "resumed", "ids"}``), so the
test can check that the ranks saw each id exactly once per epoch, before and after a restart or a resume.
The end writes ``@@params {"sha": ...}``, a hash of the final parameters' bytes (bit-for-bit comparisons).
``--formats a,b,...``: first read one batch of each named dataset and write ``@@format`` with its columns.
``--fail-once-at-step N``: rank 1 dies after step N unless the run was restored.
``--stuck``: the preprocess asks for a resource no node has (its Ray Data tasks never run).
``--pause-at-step N``: after step N (its checkpoint reported), unless the run was restored, every rank waits in
collectives (one a second, as training would) until one fails because the test killed a peer's node (the
elastic test), at most 600 s.
``--kill-feed``: rank 0 kills the job's data feed (the Feeder actor of ``train``) before reading, as a crash would.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


def out(tag, **data):
    sys.stdout.write(f"@@{tag} {json.dumps(data)}\n")
    sys.stdout.flush()


def pause_in_collectives(limit_s=600):
    import torch.distributed as dist

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        dist.all_reduce(torch.zeros(1))  # raises once a peer is gone
        time.sleep(1)
    raise RuntimeError(f"--pause-at-step: no peer was lost within {limit_s} s")


def check_formats(ctx, names):
    for name in names:
        batch = next(iter(ctx.dataset(name, batch_size=2, epochs=1)))
        first = {k: (v[0] if isinstance(v, list) else v[0].tolist()) for k, v in batch.items()}
        if ctx.is_main:
            out("format", name=name, columns=sorted(batch), rows=len(next(iter(batch.values()))), first=first)


def preprocess(dataset, ctx):
    """``--stuck``: a transform that asks for a resource no node has, so its tasks stay pending (the
    --data-timeout test); otherwise the rows as they are."""
    if "--stuck" in ctx.args:
        return dataset.map_batches(lambda b: b, batch_format="numpy", num_cpus=0, resources={"no_such_node": 1})
    return dataset


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--fail-once-at-step", type=int, default=0)
    p.add_argument("--formats", default="")
    p.add_argument("--stuck", action="store_true")
    p.add_argument("--pause-at-step", type=int, default=0)
    p.add_argument("--kill-feed", action="store_true")
    args = p.parse_args(ctx.args)
    if args.kill_feed and ctx.is_main:
        import ray

        job = ray.get_runtime_context().get_job_id()
        ray.kill(ray.get_actor(f"raytrain-data-{job}-train", namespace="raytrain"))
    if args.formats:
        check_formats(ctx, args.formats.split(","))

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    engine = ctx.deepspeed(model, torch.optim.SGD(model.parameters(), lr=0.05))
    resumed = ctx.resumed_from is not None
    step, micro, ids = ctx.start_step, 0, []
    while step < args.steps:
        for batch in ctx.dataset("train", shuffle=True, seed=7):  # one epoch (the rest of it, when restored)
            ids += batch["id"].tolist()
            loss = F.mse_loss(engine(batch["x"].float()).squeeze(-1), batch["y"].float())
            engine.backward(loss)
            engine.step()
            micro += 1
            if micro % ctx.grad_accum:
                continue
            step += 1
            out("ids", rank=ctx.rank, step=step, resumed=resumed, ids=ids, epoch=ctx.data_position()["epoch"])
            ids = []
            ctx.report({"loss": loss.item(), "step": step})
            if args.fail_once_at_step == step and not resumed and ctx.rank == min(1, ctx.world_size - 1):
                os._exit(1)  # a real process death
            if args.pause_at_step == step and not resumed:
                pause_in_collectives()
            if step == args.steps:
                break
    digest = hashlib.sha1()
    for param in engine.module.parameters():
        digest.update(param.detach().float().cpu().numpy().tobytes())
    if ctx.is_main:
        out("params", sha=digest.hexdigest())
