"""`raytrain export --format hf` without Ray or DeepSpeed: a checkpoint in the stage-0 layout (the module's
state_dict) with the model's description beside it, exported to a Hugging Face folder that
`AutoModelForCausalLM.from_pretrained` loads and that gives the model's logits; and the CLI's refusals.
The ZeRO-3 path (shards consolidated) runs in tests/e2e/test_hf.py."""
import importlib
import json

import pytest
from click.testing import CliRunner

from raytrain.checkpoints import marker as markers
from raytrain.cli.main import main as cli

torch = importlib.import_module("torch")
transformers = importlib.import_module("transformers")
peft = importlib.import_module("peft")

from raytrain.runtime.hf import model as hf_model  # noqa: E402
from raytrain.runtime.export.hf import export_hf  # noqa: E402

INPUT = torch.tensor([[1, 5, 9, 3, 7, 2, 8, 4]])


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                     bos_token_id=31, eos_token_id=31)
    return transformers.AutoModelForCausalLM.from_config(config)


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=1)
    return transformers.AutoModelForCausalLM.from_config(config)


def with_lora(model):
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def fake_checkpoint(tmp_path, model, *, described=True):
    """What raytrain writes for a ZeRO stage-0 run, with the model's description (rank 0) beside it."""
    d = tmp_path / "checkpoint_x"
    (d / "step3").mkdir(parents=True)
    torch.save({"module": model.state_dict()}, d / "step3" / "mp_rank_00_model_states.pt")
    if described:
        (d / markers.HF_FILE).write_text(json.dumps(hf_model.describe(model)))
    markers.write(d, markers.Marker(rank=0, world_size=1, step=3, tag="step3", time=1.0, metrics={},
                                    files=markers.files_in(d)))
    return d


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def test_describe_knows_hf_and_peft_models_and_nothing_else():
    assert hf_model.describe(torch.nn.Linear(2, 2)) is None
    plain = hf_model.describe(tiny_gpt2())
    assert plain["architecture"] == "GPT2LMHeadModel" and plain["adapter"] is None
    assert plain["config"]["n_layer"] == 2
    adapter = hf_model.describe(with_lora(tiny_gpt2()))
    assert adapter["architecture"] == "GPT2LMHeadModel"
    assert adapter["adapter"]["peft_type"] == "LORA" and adapter["adapter"]["target_modules"] == ["c_attn", "c_fc"]
    json.dumps(adapter)  # JSON all the way down


def test_zero_init_below_zero3_does_nothing():
    with hf_model.zero_init({"zero_optimization": {"stage": 2}}):
        layer = torch.nn.Linear(4, 4)
    assert not hasattr(layer.weight, "ds_numel") and layer.weight.numel() == 16


def test_a_plain_model_exports_to_a_sharded_folder_with_the_same_logits(tmp_path):
    model = tiny_llama()
    out = tmp_path / "llama"
    result = export_hf(str(fake_checkpoint(tmp_path, model)), str(out), max_shard_size="20KB")
    assert result["adapter"] == "none" and result["step"] == 3
    assert "config.json" in result["files"] and "model.safetensors.index.json" in result["files"]
    assert sum(f.endswith(".safetensors") for f in result["files"]) > 1  # sharded
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-5)


def test_a_lora_model_merged_and_as_an_adapter_folder_gives_the_trained_logits(tmp_path):
    model = with_lora(tiny_gpt2())
    expected = logits(model)
    ckpt = fake_checkpoint(tmp_path, model)
    merged = export_hf(str(ckpt), str(tmp_path / "merged"), merge_adapter=True)
    assert merged["adapter"] == "merged" and "adapter_config.json" not in merged["files"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    torch.testing.assert_close(logits(loaded), expected, rtol=0, atol=1e-5)

    folder = export_hf(str(ckpt), str(tmp_path / "adapter"))
    assert folder["adapter"] == "folder"
    assert {"adapter_config.json", "adapter_model.safetensors", "base/config.json"} <= set(folder["files"])
    with_adapter = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")  # base + adapter
    torch.testing.assert_close(logits(with_adapter), expected, rtol=0, atol=1e-5)


def test_bf16_export_says_so_in_its_config(tmp_path):
    model = tiny_gpt2()
    export_hf(str(fake_checkpoint(tmp_path, model)), str(tmp_path / "bf16"), dtype="bf16")
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert loaded.transformer.wte.weight.dtype == torch.bfloat16


def test_export_refusals_are_one_line_exit_2(raytrain_home, tmp_path):
    plain = fake_checkpoint(tmp_path, torch.nn.Linear(2, 2), described=False)
    runner = CliRunner()
    result = runner.invoke(cli, ["export", str(plain), "--out", str(tmp_path / "o"), "--format", "hf"])
    assert result.exit_code == 2 and "--format hf" in result.output and "no Hugging Face model" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    result = runner.invoke(cli, ["export", str(plain), "--out", str(tmp_path / "o.pt"), "--dtype", "bf16"])
    assert result.exit_code == 2 and "--dtype: only with --format hf" in result.output
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    described = fake_checkpoint(gpt, tiny_gpt2())
    result = runner.invoke(cli, ["export", str(described), "--out", str(tmp_path / "o"), "--format", "hf",
                                 "--merge-adapter"])
    assert result.exit_code == 2 and "--merge-adapter" in result.output and "no PEFT adapter" in result.output
    assert not (tmp_path / "o").exists()


def test_a_peft_models_adapter_is_saved_as_pefts_own_files(tmp_path):
    # what each checkpoint of a LoRA run holds beside DeepSpeed's state (rank 0 writes; ZeRO-3's gather of the
    # trainable parameters runs in tests/e2e/test_hf.py): PeftModel.from_pretrained(base, DIR) gives its logits
    model = with_lora(tiny_gpt2())
    assert hf_model.save_adapter(model, tmp_path, rank=0)
    assert {p.name for p in tmp_path.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    loaded = peft.PeftModel.from_pretrained(tiny_gpt2(), tmp_path)  # the same seed: the same base
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-6)
    other = tmp_path / "rank1"
    other.mkdir()
    assert hf_model.save_adapter(model, other, rank=1) and not any(other.iterdir())  # rank 0 writes
    assert not hf_model.save_adapter(tiny_gpt2(), other, rank=0)  # no adapter: nothing
