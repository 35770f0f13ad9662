"""A Hugging Face Trainer script in the shape of transformers' examples/pytorch/language-modeling/run_clm.py:

    deepspeed hf_trainer.py --deepspeed ds_config.json --output_dir out --max_steps 20 --per_device_train_batch_size 4

HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments), a causal LM built from a
config (a tiny GPT-2: nothing is downloaded), a synthetic dataset of token ids (no tokenizer), and
``Trainer(...).train()``. raytrain's tests run it unchanged in script mode. ``--fail_once_at_step N`` (a test
hook): rank 1 dies, a real process death, once step N is done, unless the Trainer continued from a checkpoint. On rank 0 it prints what the
DeepSpeed engine the Trainer built was given, so a test can check raytrain's flags reached it.
"""
import logging
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "layers of the GPT-2 built from its config"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    vocab_size: int = field(default=64, metadata={"help": "vocabulary"})
    dropout: float = field(default=0.1, metadata={"help": "GPT-2's dropouts (0: a run whose losses do not depend on "
                                                          "how the RNG streams are cut across ranks)"})


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=32, metadata={"help": "tokens per sample"})
    num_samples: int = field(default=512, metadata={"help": "synthetic training samples"})
    fail_once_at_step: int = field(default=0, metadata={"help": "test hook: rank 1 dies once step N is done"})
    probe_out: str = field(default="", metadata={"help": "test hook: the trained model's logits on a fixed input"})


class FailOnce(TrainerCallback):
    def __init__(self, step):
        self.step, self.resumed = step, False

    def on_train_begin(self, args, state, control, **kwargs):
        self.resumed = state.global_step > 0
        if self.resumed and args.process_index == 0:
            print(f"hf_trainer resumed at global_step {state.global_step}", flush=True)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.resumed and args.process_index == 1:
            print(f"rank 1: simulated crash after step {self.step}", flush=True)
            os._exit(1)


class CountingDataset(torch.utils.data.Dataset):
    """Sequences that count up by a per-sample stride (mod vocab): a causal LM learns them quickly."""

    def __init__(self, n, block_size, vocab):
        g = torch.Generator().manual_seed(1234)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        strides = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (starts + strides * torch.arange(block_size)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
    set_seed(training_args.seed)

    config = GPT2Config(
        n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=2, vocab_size=model_args.vocab_size,
        n_positions=data_args.block_size, resid_pdrop=model_args.dropout, embd_pdrop=model_args.dropout,
        attn_pdrop=model_args.dropout,
    )
    model = AutoModelForCausalLM.from_config(config)
    train_dataset = CountingDataset(data_args.num_samples, data_args.block_size, model_args.vocab_size)

    callbacks = [FailOnce(data_args.fail_once_at_step)] if data_args.fail_once_at_step else []
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, callbacks=callbacks)
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    rank, world = dist.get_rank(), dist.get_world_size()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    engine = trainer.model_wrapped
    if data_args.probe_out:  # every rank runs the forward (ZeRO-3 gathers the parameters); rank 0 saves
        probe = CountingDataset(2, data_args.block_size, model_args.vocab_size).ids.to(trainer.model.device)
        trainer.model.eval()
        with torch.no_grad():
            logits = trainer.model(input_ids=probe).logits
        if rank == 0:
            torch.save({"input": probe.cpu(), "output": logits.float().cpu()}, data_args.probe_out)
    if rank == 0:
        for i, loss in enumerate(losses):
            print(f"hf_trainer log {i} loss {loss:.4f}", flush=True)
        print(
            f"hf_trainer done: world {world}, zero {engine.zero_optimization_stage()}, "
            f"micro {engine.train_micro_batch_size_per_gpu()}, accum {engine.gradient_accumulation_steps()}, "
            f"clip {engine.gradient_clipping():g}, bf16 {engine.bfloat16_enabled()}, "
            f"steps {trainer.state.global_step}, first loss {losses[0]:.4f}, last loss {losses[-1]:.4f}, "
            f"train_loss {result.training_loss:.4f}, cwd {os.path.basename(os.getcwd())}",
            flush=True,
        )


if __name__ == "__main__":
    main()
