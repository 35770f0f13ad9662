"""The planner with Hugging Face models: counted from a config on the meta device (nothing downloaded, no
weights), and frozen parameters (a PEFT/LoRA run's base model) counted as frozen: no gradients, no
optimizer state for them."""
import importlib
import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main as cli
from raytrain.planner import memory
from raytrain.planner.memory import Layout, estimate, model_states

torch = importlib.import_module("torch")
transformers = importlib.import_module("transformers")
peft = importlib.import_module("peft")

from raytrain.planner import meta  # noqa: E402


def llama_config(tmp_path):
    transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    return tmp_path / "config.json"


def test_frozen_parameters_hold_only_their_parameter_bytes():
    full = model_states(1000, stage=2, precision="bf16", dp=2)
    lora = model_states(1000, stage=2, precision="bf16", dp=2, trainable=100)
    assert lora.gpu["params"] == full.gpu["params"] == 2 * 1000  # every parameter is still there
    assert lora.gpu["grads"] == 2 * 100 / 2 and lora.gpu["optimizer"] == 12 * 100 / 2
    assert lora.gpu["grad_fp32"] == 4 * 100 / 2
    offloaded = model_states(1000, stage=3, precision="fp32", offload="all", dp=1, trainable=10)
    assert offloaded.cpu["params"] == 4 * 1000 and offloaded.cpu["optimizer"] == (8 + 4) * 10


def test_estimate_with_trainable_counts_the_trained_part_for_states_and_buckets():
    args = dict(params=10_000, largest_layer=1000, gpus=2, gpus_per_node=2)
    full = estimate(Layout(zero=1, precision="fp32"), **args)
    lora = estimate(Layout(zero=1, precision="fp32"), trainable=500, **args)
    assert lora.states.gpu["params"] == full.states.gpu["params"]
    assert lora.states.gpu["optimizer"] == full.states.gpu["optimizer"] * 500 / 10_000
    assert lora.buffers == memory.reduce_bucket(500, "fp32") < full.buffers
    assert estimate(Layout(zero=1), trainable=None, **args).states == estimate(Layout(zero=1), **args).states


def test_a_peft_model_on_the_meta_device_counts_its_frozen_base(tmp_path):
    def build(_args):
        base = transformers.AutoModelForCausalLM.from_config(
            transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                    bos_token_id=0, eos_token_id=0))
        return peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))

    module = meta.build_on_meta(build, [])
    assert all(p.is_meta for p in module.parameters())
    shape = meta.inspect_module(module)
    assert shape.trainable == 2 * 4 * (32 + 96)  # two layers' c_attn LoRA: A (32 -> 4) and B (4 -> 96)
    assert shape.params == meta.count_parameters(module) > shape.trainable
    assert any("trainable" in note for note in shape.notes)
    assert shape.layers == 2 and shape.hidden == 32 and shape.vocab == 64


def test_a_hf_config_is_counted_on_the_meta_device(tmp_path):
    path = llama_config(tmp_path)
    assert meta.is_hf_config(path) and meta.is_hf_config(tmp_path) and not meta.is_hf_config(tmp_path / "x.py")
    shape = meta.inspect_hf_config(tmp_path)
    expected = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert shape.params == sum(p.numel() for p in expected.parameters())
    assert shape.trainable is None  # all of it trains
    assert (shape.layers, shape.hidden, shape.heads, shape.vocab) == (3, 64, 4, 1000)


def test_plan_takes_a_hf_config(tmp_path):
    path = llama_config(tmp_path)
    result = CliRunner().invoke(cli, ["plan", str(path), "--gpus", "2", "--gpu-memory", "16GB", "--seq", "64",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(tmp_path)).parameters())
    assert data["model"]["params"] == params, data["model"]
    bad = CliRunner().invoke(cli, ["plan", str(tmp_path / "missing.json"), "--gpus", "2", "--gpu-memory", "16GB"])
    assert bad.exit_code == 2 and "no such file" in bad.output
