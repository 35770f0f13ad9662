"""`raytrain export --format hf|pt` of a Hugging Face Trainer script's checkpoint, without Ray: a real Trainer
(one CPU process) saves checkpoint-N (config, weights, trainer_state.json, a tokenizer, or a PEFT adapter),
raytrain's rank-0 staging adds its marker, and the export gives a folder from_pretrained (or
PeftModel.from_pretrained) loads with the trained model's logits. The ZeRO-2/3 shards of a real DeepSpeed
Trainer run are consolidated in tests/e2e/test_hf.py."""
import importlib
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from raytrain.checkpoints import marker as markers
from raytrain.cli.main import main as cli
from tests.unit.test_hf_trainer import HF, accelerate_state_restored  # noqa: F401  (its autouse fixture)

torch = importlib.import_module("torch")
transformers = importlib.import_module("transformers")
peft = importlib.import_module("peft")
tokenizers = importlib.import_module("tokenizers")

from raytrain.runtime.export.entry import export  # noqa: E402
from raytrain.runtime.export.hf import export_hf  # noqa: E402
from raytrain.runtime.checkpoint.hf_trainer import stage  # noqa: E402

INPUT = torch.tensor([[1, 5, 9, 3, 7, 2, 8, 4]])


def script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_trainer_script", HF)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_tokenizer():
    vocab = {f"t{i}": i for i in range(63)} | {"[UNK]": 63}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[UNK]")


def tiny_gpt2():
    transformers.set_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))


def train(tmp_path, model, *, tokenizer=None, steps=2):
    """A real Trainer's checkpoint-N, staged by raytrain (rank 0 of 1: marker added), and the trained model."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2,
        report_to="none", save_steps=steps, use_cpu=True, disable_tqdm=True, seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=script().CountingDataset(64, 16, 64),
                                   processing_class=tokenizer)
    trainer.train()
    staged = stage(tmp_path / "out" / f"checkpoint-{steps}", rank=0, world_size=1, step=steps, metrics={})
    return str(shutil.move(staged, tmp_path / "stored")), trainer.model  # (stage() makes it in the temp dir)


def relist(ckpt):
    """The marker again, after a test removed files (so the checkpoint stays complete)."""
    marker = markers.read(ckpt)
    markers.write(ckpt, dataclasses.replace(marker, files={k: v for k, v in markers.files_in(ckpt).items()
                                                           if not k.startswith("raytrain_rank")}))


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def test_a_trainer_checkpoint_exports_to_a_folder_with_the_trained_logits_and_the_tokenizer(tmp_path):
    ckpt, model = train(tmp_path, tiny_gpt2(), tokenizer=tiny_tokenizer())
    result = export_hf(ckpt, str(tmp_path / "hf"), max_shard_size="20KB")
    assert result["adapter"] == "none" and result["architecture"] == "GPT2LMHeadModel" and result["step"] == 2
    assert "model.safetensors.index.json" in result["files"] and "tokenizer.json" in result["files"]
    assert "trainer_state.json" not in result["files"] and not any("raytrain" in f for f in result["files"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-6)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("t3 t5")["input_ids"] == [3, 5]

    bf16 = export_hf(ckpt, str(tmp_path / "bf16"), dtype="bf16")
    assert bf16["dtype"] == "bf16" and json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_deepspeeds_engine_state_wins_over_the_trainers_weights(tmp_path):
    # what a ZeRO-3 Trainer checkpoint looks like: config.json, no consolidated weights, DeepSpeed's engine state
    # under the tag (here stage 0's module weights; ZeRO shards go through zero_to_fp32 as for train(ctx) runs)
    ckpt, model = train(tmp_path, tiny_gpt2())
    d = Path(ckpt)
    (d / "model.safetensors").unlink()
    (d / "global_step2").mkdir()
    torch.save({"module": model.state_dict()}, d / "global_step2" / "mp_rank_00_model_states.pt")
    result = export_hf(ckpt, str(tmp_path / "hf"))
    assert result["architecture"] == "GPT2LMHeadModel"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-6)


def test_the_pt_export_of_a_trainer_checkpoint_loads_into_the_model(tmp_path):
    ckpt, model = train(tmp_path, tiny_gpt2())
    result = export(ckpt, str(tmp_path / "model.pt"))
    fresh = tiny_gpt2()
    missing, unexpected = fresh.load_state_dict(torch.load(tmp_path / "model.pt"), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    assert result["step"] == 2
    torch.testing.assert_close(logits(fresh), logits(model), rtol=0, atol=1e-6)


def lora(model):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                             task_type="CAUSAL_LM", init_lora_weights=False)  # B != 0: the adapter changes logits
    return peft.get_peft_model(model, config)


def test_a_peft_trainer_run_exports_its_adapter_or_merges_it_into_a_local_base(tmp_path):
    tiny_gpt2().save_pretrained(tmp_path / "base")
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # base_model_name_or_path: a folder
    ckpt, model = train(tmp_path, lora(base))
    expected = logits(model)
    result = export_hf(ckpt, str(tmp_path / "adapter"), dtype="fp32")
    assert result["adapter"] == "adapter" and result["architecture"] == "LORA adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(result["files"])
    fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    torch.testing.assert_close(logits(peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter")), expected,
                               rtol=0, atol=1e-6)

    merged = export_hf(ckpt, str(tmp_path / "merged"), merge_adapter=True)
    assert merged["adapter"] == "merged" and "adapter_config.json" not in merged["files"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    torch.testing.assert_close(logits(loaded), expected, rtol=0, atol=1e-5)


def test_trainer_checkpoints_that_cannot_be_exported_are_refused_with_what_works(raytrain_home, tmp_path):
    runner = CliRunner()
    ckpt, _ = train(tmp_path / "plain", tiny_gpt2())
    result = runner.invoke(cli, ["export", ckpt, "--out", str(tmp_path / "o"), "--format", "hf", "--merge-adapter"])
    assert result.exit_code == 2 and "trained no PEFT adapter; leave it out" in result.output, result.output
    (Path(ckpt) / "model.safetensors").unlink()
    relist(ckpt)
    result = runner.invoke(cli, ["export", ckpt, "--out", str(tmp_path / "o"), "--format", "hf"])
    assert result.exit_code == 2 and "holds no model weights" in result.output, result.output
    (Path(ckpt) / "config.json").unlink()
    relist(ckpt)
    result = runner.invoke(cli, ["export", ckpt, "--out", str(tmp_path / "o"), "--format", "hf"])
    assert result.exit_code == 2 and "no config.json" in result.output and "--format pt" in result.output

    adapter_ckpt, _ = train(tmp_path / "peft", lora(tiny_gpt2()))  # from_config: no base folder to merge into
    result = runner.invoke(cli, ["export", adapter_ckpt, "--out", str(tmp_path / "o"), "--format", "hf",
                                 "--merge-adapter"])
    assert result.exit_code == 2 and "--merge-adapter: the adapter's base model" in result.output, result.output
    assert "leave --merge-adapter out" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
