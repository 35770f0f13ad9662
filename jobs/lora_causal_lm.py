"""LoRA fine-tuning of a small Hugging Face causal LM (a GPT-2 built from its config: nothing is downloaded)
with a PEFT adapter, under ZeRO-2 or ZeRO-3:

    raytrain submit jobs/lora_causal_lm.py --workers 2 --zero 3 --checkpoint-every 10
    raytrain export RUN --format hf --out lora-merged --merge-adapter

Only the adapter's weights train (the base model's are frozen: no gradients, no optimizer state for them);
``raytrain plan jobs/lora_causal_lm.py`` counts them as frozen. Under ZeRO-3 the base model is built
directly partitioned (``ctx.zero_init()``). The data are jobs/gpt_zero.py's bigram token sequences, so the
loss falls (from about 5.4 to about 4.3 in 12 steps at the defaults). Checkpoints hold the adapter (and the frozen base) and the
model's config; ``raytrain export --format hf`` writes a folder ``AutoModelForCausalLM.from_pretrained`` loads.
"""
import argparse
import math
import warnings

import torch

from example_utils import add_fault_tolerance_args, after_step, save_probe
from gpt_zero import BigramTokens


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    add_fault_tolerance_args(parser)
    return parser


def base_model(a):
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.dim, n_layer=a.layers, n_head=a.heads,
                        bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        initializer_range=0.2)  # a random base with weights wide enough for an adapter to steer
    return AutoModelForCausalLM.from_config(config)


def with_adapter(base, a):
    """The base model with a LoRA adapter on attention and MLP projections; the lm head (tied to the
    embedding) and the embeddings train too (modules_to_save would copy them; here: train the LoRA only)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, target_modules=["c_attn", "c_proj", "c_fc"],
                      fan_in_fan_out=True, task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def model(args=None):
    """The model for the given job arguments (for `raytrain plan`, which counts the frozen base as frozen)."""
    a = parser().parse_args(list(args or []))
    return with_adapter(base_model(a), a)


def train(ctx):
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations, called by peft
    args = parser().parse_args(ctx.args)
    torch.manual_seed(args.seed)
    with ctx.zero_init():  # ZeRO-3: the base model is built partitioned; below ZeRO-3 a plain build
        base = base_model(args)
    peft_model = with_adapter(base, args)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    ctx.log(f"LoRA r={args.rank}: {trainable:,} trainable parameters; start ~ln({args.vocab})="
            f"{math.log(args.vocab):.3f}, floor ln(4)={math.log(4):.3f}")
    ctx.tokens_per_sample = args.seq
    engine = ctx.deepspeed(peft_model, lr=args.lr)
    data = BigramTokens(args.vocab, args.seq, ctx.dp_rank, seed=args.seed)
    for step in range(ctx.start_step, args.steps):
        total = 0.0
        for micro in range(ctx.grad_accum):
            x, y = data.batch(ctx.micro_batch, step, micro)
            logits = engine(input_ids=x.to(ctx.device)).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                     y.to(ctx.device).reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        ctx.report({"loss": total / ctx.grad_accum})
        after_step(ctx, args, step + 1)
    engine.eval()
    save_probe(ctx, lambda ids: engine(input_ids=ids).logits, args,
               BigramTokens(args.vocab, args.seq, 0, seed=args.seed).batch(2, 10**6, 0)[0])
