"""A GPT-style model split by tensor parallelism (DeepSpeed AutoTP), with ZeRO data parallelism around it.

    raytrain submit jobs/gpt_tp.py --workers 2 --tp 2 --zero 1 -- --steps 10

Its Linear layers carry Megatron's role names, so raytrain derives the split by itself: q_proj, k_proj,
v_proj and up_proj are split by output (column), o_proj and down_proj by input (row), and each rank keeps
heads / tp attention heads. A model with other names declares ``TP_SPEC`` (below, commented) or is given
``--tp-spec FILE``. The workers of one tensor-parallel group see the same batch: data is sharded by
``ctx.dp_rank``. In fp32, --tp 2 trains exactly like --tp 1.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from example_utils import add_fault_tolerance_args, after_step, batch_generator

# TP_SPEC = {"layer_specs": [
#     {"patterns": [r".*\.(q_proj|k_proj|v_proj|up_proj)\.weight$"], "partition_type": "column"},
#     {"patterns": [r".*\.(o_proj|down_proj)\.weight$"], "partition_type": "row"},
# ]}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: after a column split each rank holds heads / tp of them
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.up_proj = nn.Linear(dim, 4 * dim)
        self.down_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down_proj(F.gelu(self.up_proj(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.checkpointed = lambda fn, x: fn(x)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = self.checkpointed(block, x)
        return self.head(self.ln(x))


def tokens(vocab: int, seq: int, size: int, seed: int, dp_rank: int, step: int, micro: int):
    """A fixed random bigram language (same on every rank); samples depend on (dp_rank, step, micro)."""
    successors = torch.randint(0, vocab, (vocab, 4), generator=torch.Generator().manual_seed(seed))
    gen = batch_generator(seed, dp_rank, step, micro)
    toks = torch.empty(size, seq + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, vocab, (size,), generator=gen)
    for i in range(seq):
        toks[:, i + 1] = successors[toks[:, i], torch.randint(0, 4, (size,), generator=gen)]
    return toks[:, :-1], toks[:, 1:]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    add_fault_tolerance_args(p)
    return p


def model(args=None) -> nn.Module:
    a = parser().parse_args(list(args or []))
    return GPT(a.vocab, a.dim, a.layers, a.heads, a.seq)


def train(ctx):
    args = parser().parse_args(ctx.args)
    torch.manual_seed(args.seed)  # every rank builds the same full model; AutoTP keeps its slice
    net = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    net.checkpointed = ctx.activation_checkpointed  # --activation-checkpointing recomputes each block in backward
    engine = ctx.deepspeed(net, lr=args.lr)
    for step in range(ctx.start_step, args.steps):
        total = 0.0
        for micro in range(ctx.grad_accum):
            x, y = tokens(args.vocab, args.seq, ctx.micro_batch, args.seed, ctx.dp_rank, step, micro)
            logits = engine(x.to(ctx.device))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.to(ctx.device).reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        ctx.report({"loss": total / ctx.grad_accum})
        after_step(ctx, args, step + 1)
