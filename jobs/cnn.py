"""A small CNN on synthetic MNIST-shaped data (the seed articles' example), with DeepSpeed on Ray workers.

    raytrain submit jobs/cnn.py --workers 2 --zero 1 --precision bf16 --grad-accum 2 --micro-batch 16 -- --steps 30

Two conv layers and two linear layers, SGD with momentum 0.9, CrossEntropyLoss. The data is made on
the fly: each class is a fixed random 28x28 pattern plus noise, so the loss falls within a few steps and
nothing is downloaded. Runs unchanged on CPU workers (gloo) and on GPUs.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from example_utils import add_fault_tolerance_args, after_step, batch_generator, before_backward, save_probe


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.fc1 = nn.Linear(16 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def model(args=None) -> nn.Module:
    """The model, for `raytrain plan` and for loading an exported state_dict."""
    return Net()


class SyntheticMNIST:
    """Class prototypes shared by every rank (same seed); the noise differs per rank (its data shard)."""

    def __init__(self, rank: int, seed: int = 0, noise: float = 0.6):
        self.prototypes = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(seed))
        self.rank, self.seed, self.noise = rank, seed, noise

    def batch(self, size: int, step: int, micro: int):
        gen = batch_generator(self.seed, self.rank, step, micro)
        labels = torch.randint(0, 10, (size,), generator=gen)
        images = self.prototypes[labels] + self.noise * torch.randn(size, 1, 28, 28, generator=gen)
        return images, labels


def train(ctx):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    add_fault_tolerance_args(parser)
    args = parser.parse_args(ctx.args)

    torch.manual_seed(args.seed)
    engine = ctx.deepspeed(Net(), optimizer=lambda params: torch.optim.SGD(params, lr=args.lr, momentum=0.9))
    data = SyntheticMNIST(ctx.dp_rank, seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(ctx.start_step, args.steps):
        total = 0.0
        for micro in range(ctx.grad_accum):
            images, labels = data.batch(ctx.micro_batch, step, micro)
            logits = engine(images.to(ctx.device, ctx.dtype))
            loss = loss_fn(logits.float(), labels.to(ctx.device))
            before_backward(ctx, args, step + 1, micro, loss)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        ctx.report({"loss": total / ctx.grad_accum})
        after_step(ctx, args, step + 1)
    save_probe(ctx, engine, args, SyntheticMNIST(0, seed=args.seed).batch(4, 10**6, 0)[0].to(ctx.dtype))
