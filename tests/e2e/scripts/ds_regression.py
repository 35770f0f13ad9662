"""A DeepSpeedExamples-style training script, written for the deepspeed launcher:

    deepspeed ds_regression.py --deepspeed --deepspeed_config ds_config.json --steps 20

argparse with --local_rank and deepspeed.add_config_arguments, deepspeed.init_distributed(), and
deepspeed.initialize(args=args, model=..., model_parameters=...). The config comes from --deepspeed_config;
the optimizer is a client torch optimizer (an optimizer named in the config would compile FusedAdam on CPU).
raytrain's tests run it unchanged in script mode.
"""
import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F


def get_args():
    parser = argparse.ArgumentParser(description="tiny linear regression with DeepSpeed")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=0.2)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = get_args()
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    # what the launcher would have given this process
    assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ["LOCAL_RANK"])
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    assert args.deepspeed and args.deepspeed_config, args

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, optimizer=optimizer, model_parameters=model.parameters()
    )
    w_true = torch.randn(8, 1, generator=torch.Generator().manual_seed(42)) / 8 ** 0.5  # targets of variance ~1
    micro = engine.train_micro_batch_size_per_gpu()
    xs = torch.randn(8 * micro, 8, generator=torch.Generator().manual_seed(1000 + rank))  # this rank's shard
    batch = 0
    for step in range(1, args.steps + 1):
        for _ in range(engine.gradient_accumulation_steps()):
            x = xs[(batch % 8) * micro:(batch % 8 + 1) * micro]
            batch += 1
            loss = F.mse_loss(engine(x), x @ w_true)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"ds_regression step {step} loss {loss.item():.6f}", flush=True)
    if rank == 0:
        print(f"ds_regression done: world {world}, zero {engine.zero_optimization_stage()}, "
              f"micro {micro}, accum {engine.gradient_accumulation_steps()}", flush=True)


if __name__ == "__main__":
    main()
