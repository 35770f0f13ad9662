"""Hugging Face Trainer scripts in script mode, without Ray: detection, the script's TrainingArguments merged
with raytrain's flags (contradictions refused before submitting), the DeepSpeed config with "auto" for what
the Trainer owns, the arguments the workers give the script's real HfArgumentParser, and the callback that
turns the Trainer's logs into raytrain's metrics events (a real Trainer on CPU, one process)."""
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.config import Options, resolve
from raytrain.config.hf_trainer import is_trainer_script, script_values
from raytrain.config.job_check import check_job_file
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
    import transformers
    from raytrain.runtime.worker.script import argparse_hook

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
    import transformers
    import importlib.util

    from raytrain.runtime.hf.trainer import trainer_hooks

    spec = importlib.util.spec_from_file_location("hf_trainer_script", HF)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr("raytrain.runtime.worker.reporter.MONITOR_INTERVAL_S", 0)  # no sampler thread
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


# -- checkpoints: raytrain's flags against the Trainer's save arguments ---------------------------------------
def test_checkpoint_flags_reach_the_trainer_as_its_save_arguments():
    p = plan(checkpoint_every=4, keep=2)
    assert (p.checkpoint_every, p.keep) == (4, 2)
    assert {k: p.script_defaults[k] for k in ("--save_strategy", "--save_steps", "--save_total_limit")} == {
        "--save_strategy": "steps", "--save_steps": "4", "--save_total_limit": "2"}
    p = plan()  # nothing given: the Trainer's own saving stands, nothing added
    assert p.checkpoint_every == 0 and p.keep is None
    assert not {"--save_strategy", "--save_steps", "--save_total_limit"} & set(p.script_defaults)


@pytest.mark.parametrize("args, kw, expected", [
    (["--save_steps", "50", "--save_total_limit=3"], {}, (50, 3)),  # the script's own fill raytrain's plan
    (["--save_steps", "4", "--save_strategy", "steps"], {"checkpoint_every": 4, "keep": 2}, (4, 2)),  # agree
    (["--save_steps", "0.25"], {}, (0, None)),  # a fraction of the run: the Trainer's, no fixed interval
    (["--save_strategy", "epoch", "--save_steps", "7"], {}, (0, None)),
])
def test_the_scripts_save_arguments_fill_the_plan(args, kw, expected):
    p = plan(*args, **kw)
    assert (p.checkpoint_every, p.keep) == expected


@pytest.mark.parametrize("kw, args, message", [
    ({"checkpoint_every": 4}, ["--save_steps", "5"], "--checkpoint-every 4 contradicts the script's --save_steps 5"),
    ({"checkpoint_every": 4}, ["--save_strategy", "no"],
     "--checkpoint-every 4 contradicts the script's --save_strategy no"),
    ({"checkpoint_every": 4}, ["--save_strategy=epoch"],
     "--checkpoint-every 4 contradicts the script's --save_strategy epoch"),
    ({"keep": 2}, ["--save_total_limit", "3"], "--keep 2 contradicts the script's --save_total_limit 3"),
    ({"resume": "run-1"}, ["--resume_from_checkpoint", "out/checkpoint-4"],
     "--resume run-1 and the script's --resume_from_checkpoint out/checkpoint-4 both name the point"),
    ({}, ["--save_steps", "x"], "--save_steps x .*expected a number"),
])
def test_checkpoint_contradictions_are_refused_naming_both(kw, args, message):
    with pytest.raises(ConfigError, match=message):
        plan(*args, **kw)


def test_cli_refuses_a_checkpoint_contradiction_before_submitting(raytrain_home):
    r = CliRunner().invoke(main, ["submit", str(HF), "--workers", "2", "--checkpoint-every", "4", "--dry-run", "--",
                                  "--save_steps", "10"])
    assert r.exit_code == 2, r.output
    assert "--checkpoint-every 4 contradicts the script's --save_steps 10 (its TrainingArguments)" in r.stderr
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["submit", str(SCRIPTS / "ds_regression.py"), "--checkpoint-every", "4",
                                  "--dry-run"])  # a script that is not a Trainer's still saves its own
    assert r.exit_code == 2 and "this script (script mode) saves and loads its own checkpoints" in r.stderr


# -- checkpoints: the worker side (no Ray: the files, the markers, the resume) --------------------------------
@pytest.mark.parametrize("name, rank", [
    ("global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt", 1),
    ("global_step4/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt", 3),
    ("global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt", 0),
    ("global_step4/mp_rank_00_model_states.pt", 0),
    ("rng_state_1.pth", 1), ("rng_state.pth", 0), ("trainer_state.json", 0), ("latest", 0),
    ("model.safetensors", 0), ("scheduler.pt", 0), ("zero_to_fp32.py", 0),
])
def test_each_checkpoint_file_has_one_owner(name, rank):
    from raytrain.runtime.checkpoint.hf_trainer import owner

    assert owner(name) == rank


def _trainer_checkpoint(folder, ranks=2, step=4):
    """The files DeepSpeed and the Trainer write into checkpoint-N for ``ranks`` ranks (one shared folder)."""
    (folder / f"global_step{step}").mkdir(parents=True)
    (folder / "latest").write_text(f"global_step{step}")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for r in range(ranks):
        (folder / f"global_step{step}" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"x" * (r + 10))
        (folder / f"rng_state_{r}.pth").write_bytes(b"r" * (r + 1))


def test_each_rank_stages_its_own_files_and_together_they_make_a_complete_checkpoint(tmp_path):
    import shutil

    from raytrain.checkpoints.store import inspect, resolve_resume
    from raytrain.runtime.checkpoint.hf_trainer import stage

    src = tmp_path / "out" / "checkpoint-4"
    _trainer_checkpoint(src)
    staged = [stage(src, rank=r, world_size=2, step=4, metrics={"step": 4, "loss": 1.5}) for r in (0, 1)]
    rank1 = sorted(str(p.relative_to(staged[1])) for p in Path(staged[1]).rglob("*") if p.is_file())
    assert rank1 == ["global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt", "raytrain_rank1.json", "rng_state_1.pth"]
    storage = tmp_path / "storage" / "run-1" / "checkpoint_2026-01-01_00-00-00.000000"
    half = inspect(shutil.copytree(staged[0], storage))
    assert not half.complete and half.reason == "rank 1 marker missing"  # rank 1's shard has not arrived
    shutil.copytree(staged[1], storage, dirs_exist_ok=True)  # what Ray Train's storage does with both reports
    info = inspect(storage)
    assert info.complete and (info.step, info.world_size, info.metrics["loss"]) == (4, 2, 1.5), info
    assert resolve_resume("run-1", str(tmp_path / "storage")).path == str(storage)
    from raytrain.checkpoints.marker import read

    assert read(storage, 0).tag == "global_step4"
    assert (storage / "trainer_state.json").exists() and (storage / "rng_state_1.pth").exists()


def test_a_checkpoint_of_the_same_world_size_or_stage_0_is_given_to_the_trainer_as_it_is(tmp_path):
    from raytrain.runtime.checkpoint.hf_trainer import prepare_resume, stage

    src = tmp_path / "checkpoint-4"
    _trainer_checkpoint(src, ranks=1)
    batch = {"micro": 2, "grad_accum": 1, "world_size": 1}
    restored = stage(src, rank=0, world_size=1, step=4, metrics={}, batch=batch)
    config = {"zero_optimization": {"stage": 2}}
    same = prepare_resume(restored, world_size=1, local_rank=0, config=config, log=print)
    assert (same.folder, same.step, same.saved_world_size) == (restored, 4, 1) and "checkpoint" not in config
    assert same.batch == {"micro": 2, "grad_accum": 1, "world_size": 1}
    whole = prepare_resume(restored, world_size=2, local_rank=0, config={"zero_optimization": {"stage": 0}}, log=print)
    assert whole.folder == restored  # stage 0: whole state on every rank
    unmarked = prepare_resume(str(src), world_size=2, local_rank=0, config=config, log=print)
    assert unmarked.folder == str(src) and unmarked.step is None


@pytest.mark.parametrize("saved, world, files", [
    (2, 1, {"rng_state.pth": "rng_state_0.pth"}),
    (1, 2, {"rng_state_0.pth": "rng_state.pth", "rng_state_1.pth": "rng_state.pth"}),
    (2, 3, {"rng_state_0.pth": "rng_state_0.pth", "rng_state_1.pth": "rng_state_1.pth",
            "rng_state_2.pth": "rng_state_0.pth"}),
    (4, 2, {"rng_state_0.pth": "rng_state_0.pth", "rng_state_1.pth": "rng_state_1.pth"}),
])
def test_each_rank_of_the_new_world_gets_an_rng_file(saved, world, files):
    from raytrain.runtime.checkpoint.hf_trainer import rng_files

    assert rng_files(saved, world) == files


def test_the_resharded_folder_holds_the_converted_state_the_trainers_files_and_one_rng_file_per_rank(tmp_path):
    from raytrain.runtime.checkpoint.hf_trainer import stage, trainer_folder

    src = tmp_path / "checkpoint-4"
    _trainer_checkpoint(src, ranks=2)
    (src / "scheduler.pt").write_bytes(b"s")
    storage = tmp_path / "storage"
    for r in (0, 1):
        shutil.copytree(stage(src, rank=r, world_size=2, step=4, metrics={}), storage, dirs_exist_ok=True)
    universal = tmp_path / "universal" / "abc"
    (universal / "global_step4" / "zero").mkdir(parents=True)
    folder = Path(trainer_folder(str(storage), str(universal), "global_step4", saved_world_size=2, world_size=1,
                                 local_rank=0))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["global_step4", "latest_universal", "rng_state.pth", "scheduler.pt", "trainer_state.json"]
    assert (folder / "global_step4" / "zero").is_dir() and (folder / "latest_universal").read_text() == "global_step4"
    assert (folder / "rng_state.pth").read_bytes() == (storage / "rng_state_0.pth").read_bytes()
    again = trainer_folder(str(storage), str(universal), "global_step4", saved_world_size=2, world_size=1, local_rank=0)
    assert again == str(folder)  # rebuilt in place (a restart of the same run)


def test_a_resharded_trainer_run_must_keep_the_global_batch(tmp_path):
    from raytrain.runtime.checkpoint.hf_trainer import Resume, check_batch

    resume = Resume("/s/ckpt", "/tmp/x", 8, 2, {"micro": 2, "grad_accum": 1, "world_size": 2})
    check_batch(resume, micro=2, grad_accum=2, world_size=1)  # 4 = 4
    check_batch(resume, micro=4, grad_accum=1, world_size=1)
    check_batch(Resume("/s", "/s", 8, 1, resume.batch), micro=2, grad_accum=7, world_size=1)  # not resharded
    check_batch(Resume("/s", "/tmp/x", 8, 2, None), micro=2, grad_accum=7, world_size=1)  # saved before the record
    with pytest.raises(RuntimeError, match=r"global batch of 4 \(2 workers x micro 2 x grad-accum 1\); this run's is 2 "
                                           r"\(1 x 2 x 1\).*keep the global batch with --grad-accum 2 "):
        check_batch(resume, micro=2, grad_accum=1, world_size=1)
    with pytest.raises(RuntimeError, match="keep the global batch with --workers 2$"):
        check_batch(resume, micro=3, grad_accum=1, world_size=1)



def test_cli_refuses_a_resharded_resume_that_changes_the_global_batch_before_submitting(raytrain_home, tmp_path):
    # a complete Trainer checkpoint saved by 2 workers (micro 2, accum 1: global batch 4) resumed on 1 worker:
    # micro 2 x accum 1 is refused by the dry run (exit 2, naming the --grad-accum that keeps the batch), as the
    # workers would refuse it after starting; micro 2 x accum 2 passes
    from raytrain.checkpoints import marker as markers

    ckpt = tmp_path / "run" / "checkpoint_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    (ckpt / "raytrain_trainer.json").write_text(json.dumps({"micro": 2, "grad_accum": 1, "world_size": 2}))
    for rank in (0, 1):
        (ckpt / f"rng_state_{rank}.pth").write_bytes(b"x")
        markers.write(ckpt, markers.Marker(rank=rank, world_size=2, step=8, tag="global_step8", time=1.0,
                                           metrics={}, files={f"rng_state_{rank}.pth": 1}))
    base = ["submit", str(HF), "--workers", "1", "--micro-batch", "2", "--resume", str(ckpt), "--dry-run"]
    r = CliRunner().invoke(main, [*base, "--grad-accum", "1"])
    assert r.exit_code == 2, r.output
    assert (f"--resume {ckpt}: checkpoint {ckpt} was saved with a global batch of 4 (2 workers x micro 2 x "
            "grad-accum 1); this run's is 2 (1 x 2 x 1)") in r.stderr, r.stderr
    assert "keep the global batch with --grad-accum 2 (the Trainer's --gradient_accumulation_steps)" in r.stderr
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, [*base, "--grad-accum", "2"])
    assert r.exit_code == 0, r.output

def test_the_trainer_continues_from_raytrains_restore_point(tmp_path, capsys, monkeypatch):
    # a real Trainer (one CPU process) saves checkpoint-2; a new Trainer inside trainer_hooks(restore_from=...)
    # whose script calls train() with no resume argument continues at step 3: global_step does not restart at 0
    import transformers
    import importlib.util

    from raytrain.runtime.checkpoint.hf_trainer import prepare_resume, stage
    from raytrain.runtime.hf.trainer import trainer_hooks

    spec = importlib.util.spec_from_file_location("hf_trainer_script", HF)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr("raytrain.runtime.worker.reporter.MONITOR_INTERVAL_S", 0)  # no sampler thread

    def trainer(out, steps):
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
            report_to="none", save_steps=2, use_cpu=True, disable_tqdm=True, seed=0,
        )
        transformers.set_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
        return transformers.Trainer(model=model, args=args, train_dataset=script.CountingDataset(64, 16, 64))

    trainer(tmp_path / "first", 2).train()
    restored = stage(tmp_path / "first" / "checkpoint-2", rank=0, world_size=1, step=2, metrics={})
    capsys.readouterr()
    resume = prepare_resume(restored, world_size=1, local_rank=0, config=None, log=print)
    with trainer_hooks(rank=0, train_batch=4, gpu=False, resume=resume):
        resumed = trainer(tmp_path / "second", 4)
        resumed.train()
    assert resumed.state.global_step == 4
    assert not hasattr(transformers.Trainer.train, "__wrapped__")  # the hook is gone after the run
    out = capsys.readouterr().out
    events = [e for e in map(parse_line, out.splitlines()) if e and e["event"] == "metrics"]
    assert [e["step"] for e in events] == [3, 4], events
    assert f"raytrain: the Trainer resumes from step 2 ({restored})" in out


def test_a_resharded_trainer_with_another_global_batch_is_refused_before_its_first_step(tmp_path, monkeypatch):
    # the hook checks the Trainer's own arguments (per_device_train_batch_size x gradient_accumulation_steps x
    # workers) against the saving run's before Trainer.train starts: nothing is trained
    import transformers
    from raytrain.runtime.checkpoint.hf_trainer import Resume
    from raytrain.runtime.hf.trainer import trainer_hooks

    monkeypatch.setattr("raytrain.runtime.worker.reporter.MONITOR_INTERVAL_S", 0)  # no sampler thread
    resume = Resume("/storage/ckpt", str(tmp_path), 8, 2, {"micro": 2, "grad_accum": 1, "world_size": 2})
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=10, report_to="none",
                                          per_device_train_batch_size=2, use_cpu=True, disable_tqdm=True)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8))
    with trainer_hooks(rank=0, train_batch=2, gpu=False, world_size=1, resume=resume):
        trainer = transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": [1] * 8}] * 8)
        with pytest.raises(RuntimeError, match=r"global batch of 4 .* this run's is 2 .* --grad-accum 2 "):
            trainer.train()
    assert trainer.state.global_step == 0
