"""Issue 4's flags: the DeepSpeed config each one produces and each validation rule (pure, no Ray)."""
import json

import pytest
import torch.nn as nn

from raytrain.config import Options, resolve
from raytrain.errors import ConfigError
from raytrain.planner.partition import PartitionError, check_tp, choose_spec, default_spec
from tests.conftest import JOBS

TP_JOB, PIPE_JOB, GPT = str(JOBS / "gpt_tp.py"), str(JOBS / "gpt_pipe.py"), str(JOBS / "gpt_zero.py")


def plan(job=TP_JOB, **kw):
    return resolve(Options(job=job, **kw))


def test_tp_sets_autotp_and_batch_uses_data_parallel_size():
    p = plan(workers=4, tp=2, micro_batch=2, grad_accum=3)
    assert p.deepspeed["tensor_parallel"] == {"autotp_size": 2}
    assert p.parallel == {"dp": 2, "tp": 2, "pp": 1}
    assert p.train_batch == 2 * 3 * 2
    # DeepSpeed derives train_batch_size itself under AutoTP (its check counts every rank)
    assert "train_batch_size" not in p.deepspeed
    assert p.deepspeed["train_micro_batch_size_per_gpu"] == 2 and p.deepspeed["gradient_accumulation_steps"] == 3


def test_pp_divides_workers_and_keeps_train_batch():
    p = plan(job=PIPE_JOB, workers=4, pp=2, grad_accum=4, pp_partition="uniform")
    assert p.parallel == {"dp": 2, "tp": 1, "pp": 2} and p.deepspeed["train_batch_size"] == 1 * 4 * 2
    assert p.pp_partition == "uniform"


def test_tp_spec_file_becomes_partition_config(tmp_path):
    spec = tmp_path / "tp.json"
    spec.write_text(json.dumps({"layer_specs": [{"patterns": [r".*\.fc_a\.weight$"], "partition_type": "column"}]}))
    p = plan(workers=2, tp=2, tp_spec=str(spec))
    assert p.deepspeed["tensor_parallel"]["partition_config"] == {
        "use_default_specs": False,
        "layer_specs": [{"patterns": [r".*\.fc_a\.weight$"], "partition_type": "column"}],
    }


def test_activation_checkpointing_and_zero3_knobs():
    p = plan(zero=3, activation_checkpointing=True, prefetch_bucket_size=5_000_000, max_live_parameters=10**8)
    assert p.deepspeed["activation_checkpointing"]["partition_activations"] is False
    assert p.activation_checkpointing is True
    z = p.deepspeed["zero_optimization"]
    assert z["stage3_prefetch_bucket_size"] == 5_000_000 and z["stage3_max_live_parameters"] == 10**8


def test_zero_plus_plus_on_gpu_workers():
    p = plan(zero=3, gpus_per_worker=1, workers=8, quantized_weights=True, quantized_gradients=True,
             hpz_partition_size=4)
    z = p.deepspeed["zero_optimization"]
    assert z["zero_quantized_weights"] and z["zero_quantized_gradients"] and z["zero_hpz_partition_size"] == 4


def test_fp16_loss_scaling_from_ds_config(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"fp16": {"initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 4}}))
    fp16 = plan(precision="fp16", gpus_per_worker=1, ds_config=str(ds)).deepspeed["fp16"]
    assert fp16 == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                    "hysteresis": 4, "min_loss_scale": 1}


def test_offload_optimizer_with_zero2():
    ds = plan(zero=2, offload="optimizer", gpus_per_worker=1).deepspeed
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert ds["zero_force_ds_cpu_optimizer"] is False


@pytest.mark.parametrize(
    "kw, flag, words",
    [
        (dict(workers=3, tp=2), "--workers", "--workers 3 is not divisible by --tp 2 x --pp 1 = 2"),
        (dict(job=PIPE_JOB, workers=4, tp=2, pp=2), "--tp", "--tp and --pp together"),
        (dict(job=PIPE_JOB, workers=2, pp=2, zero=3), "--zero", "use --zero 1 (or 0) with --pp"),
        (dict(job=PIPE_JOB, workers=2, pp=2, zero=2), "--zero", "DeepSpeed refuses ZeRO-2/3 with pipeline"),
        (dict(job=GPT, workers=2, pp=2), "--pp", "gives raytrain no layers"),
        (dict(job=PIPE_JOB, workers=2, pp=2, pp_partition="random"), "--pp-partition", "parameters, uniform"),
        (dict(pp_partition="uniform"), "--pp-partition", "needs --pp 2"),
        (dict(tp_spec="x.json"), "--tp-spec", "needs --tp 2"),
        (dict(workers=2, tp=2, tp_spec="/nonexistent.json"), "--tp-spec", "no such file"),
        (dict(zero=2, quantized_weights=True, gpus_per_worker=1), "--zero", "(ZeRO++) need --zero 3"),
        (dict(zero=3, quantized_gradients=True), "--gpus-per-worker", "run CUDA kernels"),
        (dict(zero=3, gpus_per_worker=1, workers=6, hpz_partition_size=4), "hpz_partition_size", "must divide"),
        (dict(zero=2, prefetch_bucket_size=10), "prefetch_bucket_size", "needs --zero 3"),
        (dict(tp=0), "--tp", ">= 1"),
        (dict(offload="optimizer", zero=0), "--offload", "needs ZeRO"),
        (dict(precision="fp16"), "--precision", "use --precision bf16"),
    ],
)
def test_each_rule(kw, flag, words):
    with pytest.raises(ConfigError) as err:
        plan(**kw)
    assert err.value.flag == flag and words in str(err.value)


def test_tp_spec_with_a_bad_partition_type(tmp_path):
    spec = tmp_path / "tp.yaml"
    spec.write_text("layer_specs:\n  - patterns: ['.*fc']\n    partition_type: diagonal\n")
    with pytest.raises(ConfigError, match="partition_type 'diagonal': use column or row"):
        plan(workers=2, tp=2, tp_spec=str(spec))


# -- worker-side checks on real modules ----------------------------------------------------------
def load_job(name):
    import importlib.util
    import sys

    sys.path.insert(0, str(JOBS))
    try:
        spec = importlib.util.spec_from_file_location(name, JOBS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(JOBS))


def test_derived_spec_splits_the_gpt_tp_layers():
    roles = check_tp(load_job("gpt_tp").model([]), default_spec(), 2)
    assert roles["blocks.0.attn.q_proj"] == "column" and roles["blocks.0.up_proj"] == "column"
    assert roles["blocks.1.attn.o_proj"] == "row" and roles["blocks.1.down_proj"] == "row"
    assert "head" not in roles  # unmatched layers stay replicated


def test_a_model_with_no_known_layer_names_is_refused_naming_them():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(PartitionError, match=r"none of its Linear layers \(0, 2\)"):
        check_tp(model, default_spec(), 2)


def test_tp_that_does_not_divide_a_layer_is_refused():
    with pytest.raises(PartitionError, match=r"--tp 3 does not divide these layers: blocks.0.attn.q_proj \(column, output size 64\)"):
        check_tp(load_job("gpt_tp").model([]), default_spec(), 3)


def test_cli_checks_the_split_on_the_meta_device_before_submitting(raytrain_home):
    from click.testing import CliRunner

    from raytrain.cli.main import main

    r = CliRunner().invoke(main, ["submit", TP_JOB, "--workers", "3", "--tp", "3", "--dry-run"])
    assert r.exit_code == 2
    assert "--tp 3 does not divide these layers: blocks.0.attn.q_proj (column, output size 64)" in r.output
    assert "and 8 more" in r.output
    ok = CliRunner().invoke(main, ["submit", TP_JOB, "--workers", "2", "--tp", "2", "--dry-run", "--json"])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("value, strategy", [(None, "PACK"), ("spread", "SPREAD"), ("strict-spread", "STRICT_SPREAD")])
def test_placement(value, strategy):
    assert plan(job=GPT, placement=value).scaling.placement_strategy == strategy


def test_unknown_placement_from_a_profile():
    with pytest.raises(ConfigError, match="--placement diagonal: use one of pack, spread, strict-spread"):
        plan(job=GPT, placement="diagonal")


def test_the_spec_is_the_configured_one_then_the_jobs_then_derived():
    given = {"layer_specs": [{"patterns": [".*fc"], "partition_type": "row"}]}
    job = {"layer_specs": [{"patterns": [".*proj"], "partition_type": "column"}]}
    assert choose_spec(given, job) is given
    assert choose_spec(None, job) == {"use_default_specs": False, **job}
    assert choose_spec(None, None) == default_spec()
