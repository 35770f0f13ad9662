"""Script mode, CLI side (pure): which mode a file gets, the plan, the user's --deepspeed_config merged or refused."""
import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.config import Options, resolve
from raytrain.config.job_check import check_job_file
from raytrain.config.script_args import find_config_arg, gives_option, replace_config_args
from raytrain.errors import ConfigError
from tests.conftest import JOBS, ROOT

SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
MAIN_GUARD = 'def main():\n    pass\n\nif __name__ == "__main__":\n    main()\n'


def write(tmp_path, text, name="train.py"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# -- detection ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, mode, reason",
    [
        (MAIN_GUARD, "script", '`if __name__ == "__main__":` block'),
        ("if '__main__' == __name__:\n    print(1)\n", "script", "__main__"),
        ("import torch.distributed as dist\ndist.init_process_group('gloo')\n", "script", "module level (line 2)"),
        ("for i in range(3):\n    print(i)\n", "script", "module level (line 1)"),
        ("def train(ctx):\n    pass\n", "train", "train(ctx)"),
        # a job file may keep a __main__ block for local runs: train's first parameter is ctx
        ("def train(ctx):\n    pass\n\nif __name__ == '__main__':\n    train(None)\n", "train", "train(ctx)"),
        # DeepSpeedExamples style: a train(args, engine) helper and a __main__ block is a script
        ("def train(args, engine):\n    pass\n\nif __name__ == '__main__':\n    train(1, 2)\n", "script",
         "does not take ctx"),
        ("def train():\n    pass\n\ntrain()\n", "script", "module level"),
        ('"""docstring only and definitions"""\nX = 1\ndef train(job):\n    pass\n', "train", "train(ctx)"),
    ],
)
def test_mode_is_detected(tmp_path, source, mode, reason):
    job = check_job_file(write(tmp_path, source))
    assert job.mode == mode and reason in job.mode_reason


@pytest.mark.parametrize("name", ["cnn.py", "gpt_zero.py", "gpt_pipe.py", "gpt_tp.py"])
def test_the_example_jobs_stay_train_mode(name):
    assert check_job_file(str(JOBS / name)).mode == "train"


@pytest.mark.parametrize("name", ["ds_regression.py", "ddp_regression.py", "fails_on_rank1.py"])
def test_the_e2e_scripts_are_detected_as_scripts(name):
    assert check_job_file(str(SCRIPTS / name)).mode == "script"


def test_neither_a_job_nor_a_script_keeps_the_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"defines no train\(ctx\) function at module level.*give --script"):
        check_job_file(write(tmp_path, "x = 1\n"))
    with pytest.raises(ConfigError, match=r"train\(\) takes no argument"):
        check_job_file(write(tmp_path, "def train():\n    pass\n"))


def test_script_flag_forces_either_mode(tmp_path):
    job = check_job_file(str(JOBS / "cnn.py"), script=True)
    assert job.mode == "script" and job.mode_reason == "--script"
    assert check_job_file(write(tmp_path, "x = 1\n"), script=True).mode == "script"
    with pytest.raises(ConfigError, match=r"no train\(ctx\)"):
        check_job_file(write(tmp_path, MAIN_GUARD), script=False)


# -- the plan -----------------------------------------------------------------------------------------
def test_plan_carries_the_mode(tmp_path):
    assert resolve(Options(job=str(JOBS / "cnn.py"))).mode == "train"
    p = resolve(Options(job=write(tmp_path, MAIN_GUARD), workers=2, zero=2, micro_batch=4, job_args=["--steps", "3"]))
    assert p.mode == "script" and p.job_args == ["--steps", "3"]
    assert p.deepspeed["zero_optimization"] == {"stage": 2} and p.deepspeed["train_batch_size"] == 8
    assert p.to_dict()["mode"] == "script"


@pytest.mark.parametrize(
    "kw, flag",
    [
        (dict(checkpoint_every=5), "--checkpoint-every"),
        (dict(keep=2), "--keep"),
        (dict(resume="run-1"), "--resume"),
        (dict(pp=2, workers=2), "--pp"),
    ],
)
def test_ctx_only_options_are_refused_in_script_mode(tmp_path, kw, flag):
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=write(tmp_path, MAIN_GUARD), **kw))
    assert err.value.flag == flag and "script" in str(err.value)


def ds_json(folder, data, name="ds_config.json"):
    p = folder / name
    p.write_text(json.dumps(data))
    return p


def test_user_deepspeed_config_is_merged_with_the_flags(tmp_path):
    cfg = ds_json(tmp_path, {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4,
                             "gradient_clipping": 0.5, "bf16": {"enabled": True}})
    p = resolve(Options(job=write(tmp_path, MAIN_GUARD), workers=2, grad_accum=2,
                        job_args=["--deepspeed", "--deepspeed_config", str(cfg), "--epochs", "1"]))
    ds = p.deepspeed
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 0.5
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 16 and ds["bf16"] == {"enabled": True} and p.precision == "bf16"
    assert p.job_args == ["--deepspeed", "--deepspeed_config", str(cfg), "--epochs", "1"]  # the workers swap the path


def test_user_deepspeed_config_that_contradicts_a_flag_is_refused(tmp_path):
    ds_json(tmp_path, {"zero_optimization": {"stage": 2}})
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=write(tmp_path, MAIN_GUARD), zero=3, job_args=["--deepspeed_config=ds_config.json"]))
    assert str(err.value).startswith(
        "--zero 3 contradicts --deepspeed_config ds_config.json (a script argument) (zero_optimization.stage = 2)"
    )


def test_user_deepspeed_config_is_found_beside_the_script(tmp_path, monkeypatch):
    folder = tmp_path / "example"
    folder.mkdir()
    ds_json(folder, {"train_micro_batch_size_per_gpu": 3})
    script = write(folder, MAIN_GUARD)
    monkeypatch.chdir(tmp_path)  # relative to neither the cwd ...
    p = resolve(Options(job=script, job_args=["--deepscale_config", "ds_config.json"]))
    assert p.deepspeed["train_micro_batch_size_per_gpu"] == 3
    p = resolve(Options(job=script, job_args=["--deepspeed", "example/ds_config.json"]))  # ... and the cwd (HF)
    assert p.deepspeed["train_micro_batch_size_per_gpu"] == 3
    with pytest.raises(ConfigError, match=r"--deepspeed_config nope.json \(a script argument\): no such file"):
        resolve(Options(job=script, job_args=["--deepspeed_config", "nope.json"]))
    (folder / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match=r"--deepspeed_config .*bad.json: not valid JSON"):
        resolve(Options(job=script, job_args=["--deepspeed_config", "bad.json"]))


def test_ds_config_and_a_different_script_config_are_refused(tmp_path):
    a, b = ds_json(tmp_path, {}, "a.json"), ds_json(tmp_path, {}, "b.json")
    script = write(tmp_path, MAIN_GUARD)
    with pytest.raises(ConfigError, match="give one of them"):
        resolve(Options(job=script, ds_config=str(a), job_args=["--deepspeed_config", str(b)]))
    assert resolve(Options(job=script, ds_config=str(a), job_args=["--deepspeed_config", str(a)])).mode == "script"


# -- script_args --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, found",
    [
        (["--deepspeed", "--deepspeed_config", "a.json"], ("--deepspeed_config", "a.json", 2, False)),
        (["--deepspeed_config=a.json", "--lr", "1"], ("--deepspeed_config", "a.json", 0, True)),
        (["--deepscale_config", "x/a.json"], ("--deepscale_config", "x/a.json", 1, False)),
        (["--deepspeed", "cfg.json", "--output_dir", "o"], ("--deepspeed", "cfg.json", 1, False)),
        (["--deepspeed=cfg.json"], ("--deepspeed", "cfg.json", 0, True)),
        (["--deepspeed_config", "a.json", "--deepspeed_config", "b.json"], ("--deepspeed_config", "b.json", 3, False)),
        (["--deepspeed", "--steps", "3"], None),
        (["--deepspeed", "notjson"], None),
        (["--", "--deepspeed_config", "a.json"], None),  # after a bare --: positionals
        (["--deepspeed_config"], None),
    ],
)
def test_find_config_arg(args, found):
    arg = find_config_arg(args)
    assert (arg and (arg.flag, arg.path, arg.index, arg.inline)) == found


def test_replace_config_args_and_gives_option():
    args = ["--deepspeed_config", "a.json", "--x", "--deepspeed_config=b.json", "--", "--deepspeed_config", "c"]
    assert replace_config_args(args, "/tmp/m.json") == [
        "--deepspeed_config", "/tmp/m.json", "--x", "--deepspeed_config=/tmp/m.json", "--", "--deepspeed_config", "c",
    ]
    assert gives_option(["--local_rank=0"], "--local_rank") and gives_option(["--local-rank", "1"], "--local-rank")
    assert not gives_option(["--", "--local_rank=0"], "--local_rank") and not gives_option(["--local_ranks"], "--local_rank")


# -- the CLI ------------------------------------------------------------------------------------------
def test_dry_run_says_script_mode(raytrain_home, tmp_path):
    script = write(tmp_path, MAIN_GUARD)
    r = CliRunner().invoke(main, ["submit", script, "--workers", "2", "--dry-run", "--json", "--", "--steps", "2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["mode"] == "script" and out["plan"]["mode"] == "script"
    assert json.loads(out["runtime_env"]["env_vars"]["RAYTRAIN_PLAN"])["mode"] == "script"
    assert "raytrain: script mode (detected: no train(ctx) at module level" in r.stderr
    assert "running train.py as __main__ on every worker" in r.stderr

    r = CliRunner().invoke(main, ["submit", str(JOBS / "cnn.py"), "--script", "--dry-run"])
    assert r.exit_code == 0 and "raytrain: script mode (--script)" in r.stderr and "mode        script" in r.stdout

    r = CliRunner().invoke(main, ["submit", str(JOBS / "cnn.py"), "--dry-run", "--json"])
    assert json.loads(r.stdout)["mode"] == "train" and "script mode" not in r.stderr


def test_cli_refuses_a_contradicting_script_config(raytrain_home, tmp_path):
    ds_json(tmp_path, {"zero_optimization": {"stage": 0}})
    script = write(tmp_path, MAIN_GUARD)
    r = CliRunner().invoke(main, ["submit", script, "--zero", "2", "--dry-run", "--", "--deepspeed_config",
                                  str(tmp_path / "ds_config.json")])
    assert r.exit_code == 2 and "--zero 2 contradicts --deepspeed_config" in r.stderr


def test_no_train_and_no_main_guard_mentions_script(raytrain_home, tmp_path):
    r = CliRunner().invoke(main, ["submit", write(tmp_path, "x = 1\n"), "--dry-run"])
    assert r.exit_code == 2 and "no train(ctx)" in r.stderr and "--script" in r.stderr
