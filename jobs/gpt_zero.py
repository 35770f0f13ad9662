"""A small GPT-style transformer on synthetic tokens, trained with ZeRO-3.

    raytrain submit jobs/gpt_zero.py --workers 2 --zero 3 --precision bf16 --grad-accum 4

The tokens follow a fixed random bigram table (each token has a few likely successors), so a model
that learns drops the loss from ln(vocab) towards the table's entropy. Sizes are job arguments
(``-- --layers 4 --dim 256 --seq 128``); the defaults are tiny so that CPU workers finish in seconds.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from example_utils import add_fault_tolerance_args, after_step, batch_generator, before_backward, save_probe


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = self.mask[:t, :t].to(x.dtype)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


class BigramTokens:
    """Sequences from a fixed random bigram table (same on every rank); samples differ per rank."""

    def __init__(self, vocab: int, seq: int, rank: int, seed: int = 0, branching: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, branching), generator=g)
        self.vocab, self.seq, self.branching, self.rank, self.seed = vocab, seq, branching, rank, seed

    def batch(self, size: int, step: int, micro: int):
        gen = batch_generator(self.seed, self.rank, step, micro)
        toks = torch.empty(size, self.seq + 1, dtype=torch.long)
        toks[:, 0] = torch.randint(0, self.vocab, (size,), generator=gen)
        for i in range(self.seq):
            choice = torch.randint(0, self.branching, (size,), generator=gen)
            toks[:, i + 1] = self.successors[toks[:, i], choice]
        return toks[:, :-1], toks[:, 1:]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    add_fault_tolerance_args(parser)
    return parser


def model(args=None) -> nn.Module:
    """The model for the given job arguments (for `raytrain plan` and for loading an export)."""
    a = parser().parse_args(list(args or []))
    return GPT(a.vocab, a.dim, a.layers, a.heads, a.seq)


def train(ctx):
    args = parser().parse_args(ctx.args)
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    ctx.log(f"GPT: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
            f"floor loss ln({4})={math.log(4):.3f}, start ~ln({args.vocab})={math.log(args.vocab):.3f}")
    ctx.tokens_per_sample = args.seq  # reports get tokens/s (and TFLOP/s, MFU on GPUs)
    ctx.flops_per_sample = 6 * sum(p.numel() for p in model.parameters()) * args.seq
    engine = ctx.deepspeed(model, lr=args.lr)
    data = BigramTokens(args.vocab, args.seq, ctx.dp_rank, seed=args.seed)
    for step in range(ctx.start_step, args.steps):
        total = 0.0
        for micro in range(ctx.grad_accum):
            x, y = data.batch(ctx.micro_batch, step, micro)
            logits = engine(x.to(ctx.device))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.to(ctx.device).reshape(-1))
            before_backward(ctx, args, step + 1, micro, loss)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        ctx.report({"loss": total / ctx.grad_accum})
        after_step(ctx, args, step + 1)
    save_probe(ctx, engine, args, BigramTokens(args.vocab, args.seq, 0, seed=args.seed).batch(2, 10**6, 0)[0])
