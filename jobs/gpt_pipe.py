"""A GPT-style model split into pipeline stages (DeepSpeed PipelineModule), ZeRO-1 data parallel around it.

    raytrain submit jobs/gpt_pipe.py --workers 2 --pp 2 --zero 1 --grad-accum 4 -- --steps 10

The job hands raytrain its layers and loss (``ctx.pipeline(layers, loss_fn)``); raytrain splits them over
``--pp`` stages (``--pp-partition parameters|uniform``) and returns a pipeline engine whose
``train_batch(data_iter)`` runs ``ctx.grad_accum`` micro-batches through the stages per optimizer step.
ZeRO-2/3 cannot be combined with pipeline parallelism (DeepSpeed refuses it; raytrain says so up front).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from example_utils import add_fault_tolerance_args, after_step
from gpt_tp import tokens


class Embed(nn.Module):
    def __init__(self, vocab: int, dim: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Block(nn.Module):
    """A pre-norm transformer block taking and returning one tensor (what a pipeline stage passes on)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=x.device), 1).to(x.dtype)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


def layers(vocab: int, dim: int, n_layers: int, heads: int, seq: int) -> list:
    return [Embed(vocab, dim, seq), *(Block(dim, heads) for _ in range(n_layers)), Head(dim, vocab)]


def loss_fn(logits, labels):
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    add_fault_tolerance_args(p)
    return p


def model(args=None) -> nn.Module:
    a = parser().parse_args(list(args or []))
    return nn.Sequential(*layers(a.vocab, a.dim, a.layers, a.heads, a.seq))


def train(ctx):
    args = parser().parse_args(ctx.args)
    torch.manual_seed(args.seed)
    engine = ctx.pipeline(layers(args.vocab, args.dim, args.layers, args.heads, args.seq), loss_fn, lr=args.lr)
    for step in range(ctx.start_step, args.steps):
        batches = [
            tokens(args.vocab, args.seq, ctx.micro_batch, args.seed, ctx.dp_rank, step, micro)
            for micro in range(ctx.grad_accum)
        ]
        loss = engine.train_batch(data_iter=iter(batches))
        ctx.report({"loss": loss})
        after_step(ctx, args, step + 1)
