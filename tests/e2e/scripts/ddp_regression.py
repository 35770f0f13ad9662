"""A plain torchrun-style DDP script:

    torchrun --nproc-per-node 2 ddp_regression.py --steps 20

init_process_group("gloo") from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
DistributedDataParallel, its own argparse (no --local_rank, no DeepSpeed options). raytrain's tests run it
unchanged in script mode.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.2)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    assert os.environ["MASTER_ADDR"] and os.environ["MASTER_PORT"] and "LOCAL_RANK" in os.environ

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    w_true = torch.randn(8, 1, generator=torch.Generator().manual_seed(42)) / 8 ** 0.5  # targets of variance ~1
    xs = torch.randn(8 * args.batch, 8, generator=torch.Generator().manual_seed(1000 + rank))  # this rank's shard
    for step in range(1, args.steps + 1):
        x = xs[(step % 8) * args.batch:(step % 8 + 1) * args.batch]
        loss = F.mse_loss(model(x), x @ w_true)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"ddp_regression step {step} loss {loss.item():.6f}", flush=True)
    # the parameters stayed identical on every rank (DDP averaged the gradients)
    first = next(model.parameters()).detach().clone()
    gathered = [torch.zeros_like(first) for _ in range(world)]
    dist.all_gather(gathered, first)
    assert all(torch.equal(g, gathered[0]) for g in gathered)
    if rank == 0:
        print(f"ddp_regression done: world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
