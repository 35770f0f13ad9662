"""Hugging Face Trainer scripts in script mode, without Ray: detection, the script's TrainingArguments merged
with raytrain's flags (contradictions refused before submitting), the DeepSpeed config with "auto" for what
the Trainer owns, the arguments the workers give the script's real HfArgumentParser, and the callback that
turns the Trainer's logs into raytrain's metrics events (a real Trainer on CPU, one process)."""
import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.config import Options, resolve
from raytrain.config.hf_trainer import is_trainer_script, script_values
from raytrain.config.jobfile import check_job_file
from raytrain.errors import ConfigError
from raytrain.events import parse_line
from tests.conftest import ROOT

SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
HF = SCRIPTS / "hf_trainer.py"
AUTO = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping")


@pytest.fixture(autouse=True)
def accelerate_state_restored():
    """A TrainingArguments (built here directly or by HfArgumentParser) sets up Accelerate's process-wide
    PartialState: one process, DistributedType.NO. Left behind, every process forked later in this pytest
    process inherits it, and Accelerator() there answers from it instead of the launcher's environment
    (tests/unit/test_accelerate_script.py then saw 1 process). Clear it, and the environment, afterwards."""
    import os

    env = dict(os.environ)
    try:
        yield
    finally:
        if "accelerate.state" in __import__("sys").modules:
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)  # what accelerate's own test cases do
        os.environ.clear()
        os.environ.update(env)


def plan(*args, **kw):
    return resolve(Options(job=str(HF), workers=kw.pop("workers", 2), job_args=list(args), **kw))


def test_trainer_scripts_are_detected():
    assert check_job_file(str(HF)).hf_trainer
    assert not check_job_file(str(SCRIPTS / "ds_regression.py")).hf_trainer
    assert not check_job_file(str(ROOT / "jobs" / "cnn.py")).hf_trainer  # train(ctx) jobs never are


def test_detected_through_a_sibling_module_or_its_arguments(tmp_path):
    (tmp_path / "myargs.py").write_text("from transformers import TrainingArguments\n")
    script = tmp_path / "train.py"
    script.write_text("import myargs\n\nif __name__ == '__main__':\n    pass\n")
    assert is_trainer_script(script)
    other = tmp_path / "other.py"
    other.write_text("if __name__ == '__main__':\n    pass\n")
    assert not is_trainer_script(other)
    assert is_trainer_script(other, ["--per_device_train_batch_size", "4"])


@pytest.mark.parametrize("args, expected", [
    (["--per_device_train_batch_size", "4", "--gradient_accumulation_steps=3"], {"micro_batch": 4, "grad_accum": 3}),
    (["--max_grad_norm", "0.5", "--bf16"], {"grad_clip": 0.5, "precision": "bf16"}),
    (["--bf16", "True", "--output_dir", "x"], {"precision": "bf16"}),
    (["--bf16=false"], {"precision": "fp32"}),
    (["--per_device_train_batch_size", "4", "--per_device_train_batch_size", "2"], {"micro_batch": 2}),
    (["--", "--per_device_train_batch_size", "4"], {}),
])
def test_script_values(args, expected):
    assert {k: v for k, (v, _) in script_values(args).items()} == expected


def test_script_values_refuse_garbage():
    with pytest.raises(ConfigError, match="--per_device_train_batch_size x .*expected an integer"):
        script_values(["--per_device_train_batch_size", "x"])
    with pytest.raises(ConfigError, match="enable one"):
        script_values(["--bf16", "--fp16"])


@pytest.mark.parametrize("zero", [2, 3])
def test_without_batch_flags_the_trainer_owns_its_values(zero):
    p = plan(zero=zero)
    assert p.hf_trainer and p.mode == "script"
    assert all(p.deepspeed[key] == "auto" for key in AUTO), p.deepspeed
    assert p.deepspeed["zero_optimization"]["stage"] == zero
    # nothing given on either side: the Trainer's own default micro-batch (8), no clipping value forced
    assert (p.micro_batch, p.grad_accum, p.train_batch) == (8, 1, 16)
    assert p.script_defaults == {"--per_device_train_batch_size": "8", "--gradient_accumulation_steps": "1"}


@pytest.mark.parametrize("zero", [2, 3])
def test_raytrain_batch_flags_reach_the_trainer_as_its_arguments(zero):
    p = plan(zero=zero, micro_batch=4, grad_accum=2, grad_clip=0.5, precision="bf16")
    assert all(p.deepspeed[key] == "auto" for key in AUTO)
    assert p.deepspeed["bf16"] == {"enabled": "auto"}
    assert p.script_defaults == {
        "--per_device_train_batch_size": "4", "--gradient_accumulation_steps": "2", "--max_grad_norm": "0.5",
        "--bf16": "true",
    }
    assert p.train_batch == 16
    p = plan(train_batch=32)  # --train-batch alone: the accumulation derived from raytrain's micro-batch
    assert (p.micro_batch, p.grad_accum) == (1, 16)


def test_the_scripts_arguments_fill_raytrains_plan():
    p = plan("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "3", "--max_grad_norm", "0",
             "--bf16", grad_accum=3)  # agreeing flags are fine
    assert (p.micro_batch, p.grad_accum, p.train_batch, p.precision) == (4, 3, 24, "bf16")
    assert p.deepspeed["bf16"]["enabled"] == "auto"


@pytest.mark.parametrize("kw, args, message", [
    ({"grad_accum": 4}, ["--gradient_accumulation_steps", "2"],
     "--grad-accum 4 contradicts the script's --gradient_accumulation_steps 2"),
    ({"micro_batch": 2}, ["--per_device_train_batch_size=8"],
     "--micro-batch 2 contradicts the script's --per_device_train_batch_size 8"),
    ({"grad_clip": 0.5}, ["--max_grad_norm", "1.0"], "--grad-clip 0.5 contradicts the script's --max_grad_norm 1.0"),
    ({"precision": "fp32"}, ["--bf16"], "--precision fp32 contradicts the script's --bf16"),
])
def test_contradictions_are_refused_naming_both(kw, args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        plan(*args, **kw)


def test_a_deepspeed_config_that_contradicts_the_trainer_arguments_is_refused(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.3}))
    with pytest.raises(ConfigError, match=r"ds.json \(a script argument\) \(train_micro_batch_size_per_gpu = 4\) contradicts the script.s --per_device_train_batch_size 8"):
        plan("--deepspeed", str(cfg), "--per_device_train_batch_size", "8")
    p = plan("--deepspeed", str(cfg))  # agreeing: its values go to the Trainer as arguments, "auto" in the config
    assert p.script_defaults["--per_device_train_batch_size"] == "4"
    assert p.script_defaults["--max_grad_norm"] == "0.3" and p.deepspeed["gradient_clipping"] == "auto"


def test_cli_refuses_the_contradiction_before_submitting(raytrain_home):
    r = CliRunner().invoke(main, ["submit", str(HF), "--workers", "2", "--grad-accum", "4", "--dry-run", "--",
                                  "--gradient_accumulation_steps", "2"])
    assert r.exit_code == 2, r.output
    assert "--grad-accum 4 contradicts the script's --gradient_accumulation_steps 2" in r.stderr
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["submit", str(HF), "--workers", "2", "--zero", "3", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["batch"] == {"micro_batch": 8, "grad_accum": 1, "data_parallel": 2, "global_batch": 16}
    assert out["deepspeed"]["train_micro_batch_size_per_gpu"] == "auto"
    assert "a Hugging Face Trainer script" in r.stderr


def test_the_workers_give_a_real_hf_parser_raytrains_values(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from raytrain.runtime.script import argparse_hook

    p = plan(micro_batch=4, grad_accum=2, grad_clip=0.5)
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    monkeypatch.setattr("sys.argv", ["hf_trainer.py", "--output_dir", "/tmp/x", "--gradient_accumulation_steps", "2",
                                     "--report_to", "none"])
    delivered = set()
    with argparse_hook(config_path="/tmp/x/ds.json", local_rank=0, delivered=delivered, defaults=p.script_defaults):
        namespace, _ = parser.parse_known_args()
    assert namespace.per_device_train_batch_size == 4 and namespace.gradient_accumulation_steps == 2
    assert namespace.max_grad_norm == 0.5 and namespace.deepspeed == "/tmp/x/ds.json" and namespace.local_rank == 0
    assert "--per_device_train_batch_size" in delivered


def test_the_callback_reports_the_trainers_loss_as_metrics_events(tmp_path, capsys, monkeypatch):
    # a real Trainer (one CPU process, no DeepSpeed) built inside trainer_hooks: raytrain's callback is added
    # without the script asking, and each log becomes a metrics event with loss, lr and throughput
    transformers = pytest.importorskip("transformers")
    import importlib.util

    from raytrain.runtime.hf_trainer import trainer_hooks

    spec = importlib.util.spec_from_file_location("hf_trainer_script", HF)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setenv("RAYTRAIN_HF_LOG_EVERY_STEPS", "1")  # a log every step (the default)
    monkeypatch.setenv("RAYTRAIN_MONITOR_INTERVAL_S", "0")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=3e-3, report_to="none", logging_steps=500, use_cpu=True, disable_tqdm=True,
    )
    model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    with trainer_hooks(rank=0, train_batch=1, gpu=False):
        trainer = transformers.Trainer(model=model, args=args, train_dataset=script.CountingDataset(64, 16, 64))
        trainer.train()
    assert transformers.Trainer.__init__.__name__ == "__init__" and not hasattr(transformers.Trainer.__init__,
                                                                                "__wrapped__")
    events = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == "metrics"]
    assert [e["step"] for e in events] == [1, 2, 3, 4], events
    assert all(isinstance(e["loss"], float) and e["lr"] > 0 and e["samples_per_s"] > 0 for e in events)
    assert events[0]["lr"] > events[-1]["lr"]  # the Trainer's linear schedule
