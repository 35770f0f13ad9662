"""bench/data.py --scale's job: one epoch (a plain ``for batch in ctx.dataset("train")``) of a generated
Parquet dataset ({"id": int64, "x": binary of DIM float32, "y": float32}) through a small MLP, each rank
writing what it read: ``@@scale {"rank", "rows", "bytes_read", "blocks_read", "rss_peak", "object_store"}``.

    raytrain submit bench/jobs/data_scale.py --workers 2 --micro-batch 256 --data train=DIR -- --dim 1024

``--hidden H``: the MLP's width (sets the step's compute against the data it reads).
"""
import argparse
import json
import resource
import sys

import numpy as np
import torch
import torch.nn.functional as F


def train(ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1024)
    args = p.parse_args(ctx.args)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.dim, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    engine = ctx.deepspeed(model, torch.optim.SGD(model.parameters(), lr=1e-3))

    def decode(batch):  # on the worker, ahead of the step (the prefetch thread): raw bytes -> float32 rows
        x = np.frombuffer(b"".join(batch["x"]), dtype=np.float32).reshape(len(batch["x"]), args.dim)
        return {"x": x, "y": batch["y"]}

    data = ctx.dataset("train", shuffle=True, seed=0, columns=["x", "y"], map_batches=decode)
    rows = micro = step = 0
    for batch in data:  # one epoch
        loss = F.mse_loss(engine(batch["x"]).squeeze(-1), batch["y"])
        engine.backward(loss)
        engine.step()
        rows += len(batch["y"])
        micro += 1
        if micro % ctx.grad_accum == 0:
            step += 1
            ctx.report({"loss": loss.item(), "step": step})
    import ray

    sys.stdout.write("@@scale " + json.dumps({
        "rank": ctx.rank, "rows": rows, "bytes_read": data.source.bytes_read, "blocks_read": data.source.blocks_read,
        "blocks": len(data.source.table), "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "object_store": ray.cluster_resources().get("object_store_memory"),
    }) + "\n")
    sys.stdout.flush()
