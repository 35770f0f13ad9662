"""Pure config resolution: flags + profile + --ds-config -> Plan. No Ray, no torch."""
import json

import pytest

from raytrain.config import Options, load_profile, resolve
from raytrain.errors import ConfigError
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")


def plan(**kw):
    kw.setdefault("job", CNN)
    return resolve(Options(**kw))


def ds_file(tmp_path, data):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(data))
    return str(p)


def test_train_batch_is_micro_times_accum_times_dp():
    p = plan(workers=4, micro_batch=8, grad_accum=4, zero=3, precision="bf16")
    ds = p.deepspeed
    assert ds["train_batch_size"] == 8 * 4 * 4
    assert ds["train_micro_batch_size_per_gpu"] == 8
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["zero_optimization"] == {"stage": 3}
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert p.parallel == {"dp": 4, "tp": 1, "pp": 1}


def test_defaults_are_cpu_fp32_zero1_one_worker():
    p = plan()
    assert p.scaling.num_workers == 1 and p.scaling.use_gpu is False
    assert p.scaling.resources_per_worker == {"CPU": 1.0}
    assert p.precision == "fp32" and "bf16" not in p.deepspeed and "fp16" not in p.deepspeed
    assert p.deepspeed["zero_optimization"]["stage"] == 1
    assert p.deepspeed["zero_allow_untested_optimizer"] is True  # client optimizers under ZeRO


def test_gpus_default_follow_the_cluster():
    assert resolve(Options(job=CNN), cluster_has_gpus=True).scaling.resources_per_worker == {"CPU": 1.0, "GPU": 1.0}
    p = resolve(Options(job=CNN, gpus_per_worker=0), cluster_has_gpus=True)
    assert p.scaling.use_gpu is False


def test_fp16_gets_dynamic_loss_scaling_on_gpu():
    p = plan(precision="fp16", gpus_per_worker=1)
    assert p.deepspeed["fp16"]["enabled"] is True and p.deepspeed["fp16"]["loss_scale"] == 0
    assert p.scaling.resources_per_worker["GPU"] == 1


def test_offload_optimizer_sets_client_optimizer_switch():
    p = plan(zero=2, offload="optimizer")
    z = p.deepspeed["zero_optimization"]
    assert z["offload_optimizer"]["device"] == "cpu" and "offload_param" not in z
    assert p.deepspeed["zero_force_ds_cpu_optimizer"] is False


def test_offload_all_offloads_params_with_zero3():
    z = plan(zero=3, offload="all").deepspeed["zero_optimization"]
    assert z["offload_param"]["device"] == "cpu" and z["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize(
    "kw, flag, words",
    [
        (dict(zero=4), "--zero", "unknown ZeRO stage"),
        (dict(precision="fp16"), "--precision", "use --precision bf16"),
        (dict(offload="optimizer", zero=0), "--offload", "add --zero 2"),
        (dict(offload="all", zero=2), "--offload", "needs --zero 3"),
        (dict(workers=0), "--workers", ">= 1"),
        (dict(micro_batch=0), "--micro-batch", ">= 1"),
        (dict(grad_accum=-1), "--grad-accum", ">= 1"),
        (dict(cpus_per_worker=0), "--cpus-per-worker", "> 0"),
        (dict(gpus_per_worker=-1), "--gpus-per-worker", ">= 0"),
        (dict(precision="fp8"), "--precision", "fp32, bf16, fp16"),
        (dict(name="bad name!"), "--name", "letters, digits"),
        (dict(env={"1X": "y"}), "--env", "not a valid variable name"),
        (dict(env={"RAYTRAIN_CPU_ALLOCATOR": "jemaloc"}), "--env", "use jemalloc (Ray's, preloaded"),
    ],
)
def test_each_rule_names_the_flag(kw, flag, words):
    with pytest.raises(ConfigError) as err:
        plan(**kw)
    assert err.value.flag == flag
    assert flag in str(err.value) and words in str(err.value)


def test_train_batch_derives_accumulation():
    p = plan(workers=2, micro_batch=4, train_batch=32)
    assert p.deepspeed["gradient_accumulation_steps"] == 4


def test_train_batch_not_divisible_is_refused_with_a_multiple():
    with pytest.raises(ConfigError) as err:
        plan(workers=2, micro_batch=4, train_batch=30)
    assert str(err.value) == (
        "--train-batch 30 is not divisible by micro-batch 4 x data-parallel size 2 = 8; use --train-batch 32"
    )


def test_train_batch_disagreeing_with_micro_and_accum():
    with pytest.raises(ConfigError, match=r"--train-batch 10 != micro-batch 2 x grad-accum 2 x data-parallel size 2 = 8"):
        plan(workers=2, micro_batch=2, grad_accum=2, train_batch=10)


def test_ds_config_fills_what_flags_leave_open(tmp_path):
    ds = ds_file(tmp_path, {
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": "auto",
    })
    p = plan(ds_config=ds, workers=2, grad_accum=3)
    d = p.deepspeed
    assert d["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert d["gradient_clipping"] == 1.0 and d["bf16"]["enabled"] is True
    assert d["train_batch_size"] == 4 * 3 * 2 and d["gradient_accumulation_steps"] == 3
    assert p.precision == "bf16" and p.zero == 2


def test_ds_config_contradicting_a_flag(tmp_path):
    ds = ds_file(tmp_path, {"zero_optimization": {"stage": 2}})
    with pytest.raises(ConfigError) as err:
        plan(ds_config=ds, zero=3)
    msg = str(err.value)
    assert "--zero 3 contradicts --ds-config" in msg and "zero_optimization.stage = 2" in msg


def test_ds_config_train_batch_must_divide(tmp_path):
    ds = ds_file(tmp_path, {"train_batch_size": 10})
    with pytest.raises(ConfigError) as err:
        plan(ds_config=ds, workers=4)
    assert err.value.flag == "--ds-config"  # the config's key is to blame, not a --train-batch never given
    assert str(err.value) == (
        f"--ds-config {ds}: train_batch_size 10 is not divisible by micro-batch 1 x data-parallel size 4 = 4; "
        f"use train_batch_size 8 in --ds-config {ds}"
    )
    assert plan(ds_config=ds_file(tmp_path, {"train_batch_size": 8}), workers=4).train_batch == 8


def test_ds_config_missing_or_invalid(tmp_path):
    with pytest.raises(ConfigError, match="--ds-config .*no such file"):
        plan(ds_config=str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        plan(ds_config=str(bad))


@pytest.mark.parametrize(
    "source, words",
    [
        (None, "no such file"),
        ("def train(ctx):\n  return (\n", "syntax error at line"),
        ("def main():\n    pass\n", "defines no train(ctx)"),
        ("def train():\n    pass\n", "train() takes no argument"),
        ("def train(model, optimizer):\n    pass\n", "train(model, optimizer) needs 2 arguments"),
        ("def train(ctx, /, steps):\n    pass\n", "train(ctx, steps) needs 2 arguments"),
        ("def train(ctx, *, steps):\n    pass\n", "train(ctx, *, steps) needs 2 arguments"),
    ],
)
def test_job_file_problems(tmp_path, source, words):
    job = tmp_path / "job.py"
    if source is not None:
        job.write_text(source)
    with pytest.raises(ConfigError) as err:
        plan(job=str(job))
    assert words in str(err.value) and err.value.flag == "JOB"


@pytest.mark.parametrize("signature", ["ctx", "ctx, steps=10", "*args", "ctx, *rest, seed=0", "ctx, **kw"])
def test_a_train_callable_with_ctx_alone_passes(tmp_path, signature):
    job = tmp_path / "job.py"
    job.write_text(f"def train({signature}):\n    pass\n")
    assert plan(job=str(job)).mode == "train"


def test_profile_yaml_and_toml(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text("workers: 2\nzero: 3\nprecision: bf16\ngrad-accum: 4\nenv:\n  FOO: bar\n")
    t = tmp_path / "p.toml"
    t.write_text('[submit]\nworkers = 4\nmicro_batch = 2\n')
    assert load_profile(y) == Options(workers=2, zero=3, precision="bf16", grad_accum=4, env={"FOO": "bar"})
    assert load_profile(t) == Options(workers=4, micro_batch=2)


def test_profile_unknown_key(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text("wokers: 2\n")
    with pytest.raises(ConfigError, match="unknown key 'wokers'"):
        load_profile(y)


def test_flags_override_profile():
    merged = Options(workers=4).merged_over(Options(workers=2, zero=3))
    assert merged.workers == 4 and merged.zero == 3


def test_trackers_reach_the_plan_and_bad_combinations_are_refused(tmp_path):
    p = plan(track=["tensorboard", "mlflow"], mlflow_uri="http://127.0.0.1:5000")
    assert p.track == ["tensorboard", "mlflow"] and p.mlflow_uri == "http://127.0.0.1:5000"
    assert plan().track == [] and plan().mlflow_uri is None
    with pytest.raises(ConfigError, match="--mlflow-uri http://x: add --track mlflow") as err:
        plan(track=["tensorboard"], mlflow_uri="http://x")
    assert err.value.flag == "--mlflow-uri"
    with pytest.raises(ConfigError, match="--track wandb: script mode reports no metrics"):
        plan(job=str(JOBS.parent / "tests" / "e2e" / "scripts" / "ddp_regression.py"), track=["wandb"])
    profile = tmp_path / "p.yaml"
    profile.write_text("track: mlflow\n")
    assert resolve(Options(job=CNN).merged_over(load_profile(profile))).track == ["mlflow"]


@pytest.mark.parametrize("stem, name", [
    ("gpt_zero", "gpt-zero"), ("_probe", "probe"), ("__init__", "init"), ("my job (v2)", "my-job--v2"),
    ("train.v2", "train.v2"), ("_", "job"), ("é", "job"), ("x" * 80, "x" * 63),
])
def test_a_job_without_name_is_named_after_its_file(tmp_path, stem, name):
    job = tmp_path / f"{stem}.py"
    job.write_text((JOBS / "cnn.py").read_text())
    assert plan(job=str(job)).name == name


def test_a_bad_name_given_is_refused_as_given():
    with pytest.raises(ConfigError, match="--name '_x'") as e:
        plan(name="_x")
    assert e.value.flag == "--name"
