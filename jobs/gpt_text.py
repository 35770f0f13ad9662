"""A small GPT trained on real text: the Python standard library's docstrings and comments.

    python scripts/build_corpus.py --out data/stdlib.jsonl --tokenizer data/tokenizer.json
    raytrain submit jobs/gpt_text.py --workers 2 --micro-batch 8 --data train=data/stdlib.jsonl -- --steps 300

``preprocess`` runs on the cluster's CPUs as Ray Data transforms, once, streamed to the workers while they
train: each batch of rows is tokenized with the byte-level BPE tokenizer found next to the dataset
(``tokenizer.json``, built by scripts/build_corpus.py) and packed into blocks of ``--seq + 1`` tokens. Each worker then reads its own shard with ``ctx.dataset``:
shuffled per epoch, prefetched, and resumed at the right row after a restart. The same job runs unchanged on
GPU workers (``--gpus-per-worker 1 --precision bf16``).
"""
import argparse
import functools
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gpt_zero import GPT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--tokenizer", default="", help="tokenizer.json (default: next to the --data train file)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--in-memory", action="store_true",
                   help="pull every batch the run needs before the first step (bench/data.py's baseline)")
    return p


_TOKENIZERS: dict = {}  # path -> Tokenizer, loaded once per process (a plain dict: it ships to Ray Data's tasks)


def _tokenizer(path: str):
    from tokenizers import Tokenizer

    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = Tokenizer.from_file(path)
    return _TOKENIZERS[path]


def tokenize_and_pack(batch: dict, *, tokenizer: str, block: int) -> dict:
    """Rows of text -> rows of ``block`` token ids: every text tokenized, joined with <|endoftext|>, cut into
    blocks (the tail of each batch that does not fill a block is dropped)."""
    tok = _tokenizer(tokenizer)
    eos = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch([str(t) for t in batch["text"]]):
        ids.extend(enc.ids)
        ids.append(eos)
    n = len(ids) // block
    return {"tokens": np.asarray(ids[: n * block], dtype=np.int64).reshape(n, block)}


def tokenizer_path(args, data_path: str) -> str:
    path = Path(args.tokenizer) if args.tokenizer else Path(data_path.split("*")[0]).parent / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}: build it with scripts/build_corpus.py --tokenizer {path}")
    return str(path)


def preprocess(dataset, ctx):
    """Ray Data transforms, run once on the cluster's CPUs and streamed to the workers while they train:
    tokenize and pack the text (``ctx.task_args``: the CPUs a transform may ask for beside the workers)."""
    args = parser().parse_args(ctx.args)
    fn = functools.partial(tokenize_and_pack, tokenizer=tokenizer_path(args, ctx.path), block=args.seq + 1)
    return dataset.map_batches(fn, batch_size=256, batch_format="numpy", **ctx.task_args)


def train(ctx):
    args = parser().parse_args(ctx.args)
    torch.manual_seed(0)
    vocab = _tokenizer(tokenizer_path(args, ctx.plan.data[0]["path"])).get_vocab_size()
    model = GPT(vocab, args.dim, args.layers, args.heads, args.seq)
    ctx.log(f"GPT: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocabulary {vocab}, "
            f"loss at start ~ln({vocab}) = {math.log(vocab):.2f}")
    engine = ctx.deepspeed(model, lr=args.lr)
    batches = iter(ctx.dataset("train", shuffle=True, seed=0, epochs=None))  # a stream: next() per micro-batch
    if args.in_memory:
        batches = iter([next(batches) for _ in range((args.steps - ctx.start_step) * ctx.grad_accum)])
    for step in range(ctx.start_step + 1, args.steps + 1):
        total = 0.0
        for _ in range(ctx.grad_accum):
            tokens = next(batches)["tokens"]
            logits = engine(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        ctx.report({"loss": total / ctx.grad_accum, "epoch": ctx.data_position()["epoch"]})
        if step % args.log_every == 0:
            ctx.log(f"step {step}: loss {total / ctx.grad_accum:.3f}")
