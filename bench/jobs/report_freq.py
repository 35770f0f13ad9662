"""bench/scaling.py's job: a small GPT (as jobs/gpt_zero.py) that reports every N steps, with optional
"ballast" parameters that make checkpoints big without making steps slow.

    raytrain submit bench/jobs/report_freq.py --workers 2 --zero 1 --precision bf16 --grad-accum 4 \\
        -- --steps 30 --report-every 10 --ballast-mparams 8

``--report-every N`` calls ``ctx.report`` after every N-th optimizer step (and the last one), so the
per-report cost of the runtime shows as the difference in time per step against ``--report-every 1``.
Each report carries ``last_report_s``, the duration of the previous ``ctx.report`` call itself.
``--ballast-mparams M`` adds M million parameters that take part in training (they get a zero gradient;
DeepSpeed keeps their 16-bit copy, fp32 master and Adam moments and saves them in every checkpoint) at the
cost of an elementwise pass, not a matmul: checkpoint size grows by about 14-16 bytes per ballast parameter,
step time barely. Self-contained (a job ships with its own folder only).
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, ballast: int = 0):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.ballast = nn.Parameter(torch.zeros(ballast)) if ballast else None
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        if self.ballast is not None:
            x = x + 0 * self.ballast.sum()  # in the graph (a zero gradient), no effect on the result
        mask = self.mask[:t, :t].to(x.dtype)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--report-every", type=int, default=1)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--ballast-mparams", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p


def model(args=None) -> nn.Module:
    a = parser().parse_args(list(args or []))
    return GPT(a.vocab, a.dim, a.layers, a.heads, a.seq, int(a.ballast_mparams * 1e6))


def batch(args, size: int, rank: int, step: int, micro: int):
    g = torch.Generator().manual_seed(((args.seed * 1_000_003 + rank) * 1_000_003 + step) * 1_000 + micro)
    toks = torch.randint(0, args.vocab, (size, args.seq + 1), generator=g)
    return toks[:, :-1], toks[:, 1:]


def train(ctx):
    args = parser().parse_args(ctx.args)
    torch.manual_seed(args.seed)
    net = model(ctx.args)
    ctx.log(f"report_freq: {sum(p.numel() for p in net.parameters()) / 1e6:.2f}M parameters "
            f"(ballast {args.ballast_mparams:g}M), report every {args.report_every} step(s)")
    engine = ctx.deepspeed(net, lr=args.lr)
    last_report_s = None
    for step in range(ctx.start_step, args.steps):
        total = 0.0
        for micro in range(ctx.grad_accum):
            x, y = batch(args, ctx.micro_batch, ctx.dp_rank, step, micro)
            logits = engine(x.to(ctx.device))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.to(ctx.device).reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        done = step + 1
        if done % args.report_every == 0 or done == args.steps:
            t = time.perf_counter()
            ctx.report({"step": done, "loss": total / ctx.grad_accum, "last_report_s": last_report_s})
            last_report_s = round(time.perf_counter() - t, 5)  # how long the previous ctx.report call took
