"""Hugging Face scripts end to end: an unmodified Trainer script (tests/e2e/scripts/hf_trainer.py, the shape of
run_clm.py) and an Accelerate script on 2 CPU workers of the real local Ray cluster, through `raytrain submit`.
Lean: Trainer jobs for ZeRO-2 and ZeRO-3, each with and without raytrain's batch flags (the ZeRO-2 one without
them also exports its checkpoint; the ZeRO-3 one with them is the restart test, whose last checkpoint is
exported too), and one Accelerate job; the rest is unit tests (tests/unit/test_hf_trainer*.py)."""
import importlib
import json
from pathlib import Path

import pytest

from tests.e2e.test_scripts import SCRIPTS
from tests.e2e.test_submit import job_id_of

pytestmark = pytest.mark.e2e
importlib.import_module("transformers")  # the workers share this environment: a missing one fails
importlib.import_module("accelerate")

TRAINER_ARGS = ["--output_dir", "out", "--max_steps", "10", "--report_to", "none", "--learning_rate", "3e-3",
                "--save_strategy", "no", "--disable_tqdm", "true"]


def run_trainer(cli, *flags, script_args=(), trainer_args=TRAINER_ARGS, workers=2):
    proc = cli("submit", SCRIPTS / "hf_trainer.py", "--workers", str(workers), *flags, "--", *trainer_args,
               *script_args, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "a Hugging Face Trainer script" in proc.stderr
    job = job_id_of(out)
    log = cli("jobs", "logs", job, check=True).stdout
    assert "mismatch TrainingArguments" not in log
    return job, out, log


def assert_trainer_reported(cli, job, out):
    # raytrain's callback (added without editing the script) fed the progress line and `jobs status`
    facts = cli.facts(job)
    assert facts.losses and facts.last_metrics["step"] == 10, facts.metrics
    assert facts.losses[-1] < facts.losses[0], facts.losses
    assert all(m.get("lr", 0) > 0 and m.get("samples_per_s", 0) > 0 for m in facts.metrics)
    assert "loss" in cli.json("jobs", "status", job)["last_metrics"]
    assert f"loss {facts.losses[-1]:.4f}" in out  # the progress line


def test_trainer_script_zero3_without_raytrain_batch_flags(cli):
    # the script's own --per_device_train_batch_size; the DeepSpeed config says "auto" for what the Trainer owns
    job, out, log = run_trainer(cli, "--zero", "3", script_args=["--per_device_train_batch_size", "4"])
    assert "hf_trainer done: world 2, zero 3, micro 4, accum 1, clip 1, bf16 False, steps 10" in log, log
    assert_trainer_reported(cli, job, out)


def test_trainer_script_zero2_with_raytrain_batch_flags(cli):
    # raytrain's flags reach the Trainer as its arguments (the script gives none of them)
    job, out, log = run_trainer(cli, "--zero", "2", "--micro-batch", "2", "--grad-accum", "2", "--grad-clip", "0.5")
    assert "hf_trainer done: world 2, zero 2, micro 2, accum 2, clip 0.5, bf16 False, steps 10" in log, log
    assert_trainer_reported(cli, job, out)


def assert_export_gives_the_trained_logits(cli, job, probe_path, out, *flags):
    """`raytrain export JOB --format hf` of the run's last checkpoint: a folder from_pretrained loads, giving the
    trained model's logits on the script's probe input (fp32 throughout: atol 1e-5)."""
    import torch
    from transformers import AutoModelForCausalLM

    result = json.loads(cli("export", job, "--format", "hf", "--out", out, "--json", *flags, check=True,
                            timeout=600).stdout)
    assert result["adapter"] == "none" and result["architecture"] == "GPT2LMHeadModel", result
    assert "config.json" in result["files"] and "trainer_state.json" not in result["files"], result
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = torch.load(probe_path)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=probe["input"]).logits, probe["output"], rtol=0, atol=1e-5)
    return result


def test_trainer_script_zero2_without_raytrain_batch_flags_exports_a_hf_folder(cli, tmp_path):
    # ZeRO-2, the script's own batch size; the Trainer saves checkpoint-10 (model.safetensors and DeepSpeed's
    # ZeRO-2 state), exported from the fp32 master weights, sharded
    saving = [a for a in TRAINER_ARGS if a not in ("--save_strategy", "no")]
    probe = tmp_path / "probe.pt"
    job, out, log = run_trainer(cli, "--zero", "2", "--checkpoint-every", "10", trainer_args=saving,
                                script_args=["--per_device_train_batch_size", "4", "--probe_out", probe])
    assert "hf_trainer done: world 2, zero 2, micro 4, accum 1, clip 1, bf16 False, steps 10" in log, log
    assert_trainer_reported(cli, job, out)
    result = assert_export_gives_the_trained_logits(cli, job, probe, tmp_path / "hf", "--max-shard-size", "100KB")
    assert "model.safetensors.index.json" in result["files"] and result["step"] == 10, result


def test_accelerate_script_sees_two_processes(cli):
    proc = cli("submit", SCRIPTS / "accelerate_regression.py", "--workers", "2", "--", "--steps", "6", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    log = cli("jobs", "logs", job_id_of(out), check=True).stdout
    # the script asserts num_processes == 2 and MULTI_CPU on each rank, and equal parameters at the end
    assert "accelerate_regression done: processes 2, type MULTI_CPU, batches per process 16" in log, log


def test_lora_job_under_zero3_exports_a_hf_folder_with_the_engines_logits(cli, tmp_path):
    """jobs/lora_causal_lm.py: a GPT-2 from its config built partitioned (ctx.zero_init), a PEFT LoRA adapter,
    ZeRO-3 on 2 CPU workers; the loss falls, the planner counts the frozen base as frozen, the checkpoint
    holds the model's description and the adapter (PEFT's files), and `export --format hf --merge-adapter` gives
    a folder from_pretrained loads, with the trained engine's logits on a fixed input (fp32, atol 1e-5); the
    checkpoint's adapter on the exported base gives them too."""
    import json
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from tests.conftest import JOBS
    from tests.e2e.conftest import submit_json

    importlib.import_module("peft")
    probe_path = tmp_path / "probe.pt"
    info = submit_json(cli, JOBS / "lora_causal_lm.py", ["--workers", "2", "--zero", "3", "--precision", "fp32",
                       "--checkpoint-every", "100"], ["--steps", "12", "--probe-out", probe_path], timeout=900)
    facts = cli.facts(info["id"])
    assert len(facts.losses) == 12 and facts.losses[-1] < facts.losses[0] - 0.3, facts.losses
    assert 0 < facts.estimate["trainable"] < facts.estimate["params"], facts.estimate  # frozen base, ZeRO-3 sizes
    ckpt = json.loads(cli("jobs", "checkpoints", info["id"], "--json", check=True).stdout)[-1]
    assert ckpt["step"] == 12 and ckpt["complete"]
    described = json.loads((Path(ckpt["path"]) / "raytrain_hf.json").read_text())
    assert described["architecture"] == "GPT2LMHeadModel" and described["adapter"]["peft_type"] == "LORA"

    out = tmp_path / "merged"
    result = json.loads(cli("export", info["id"], "--format", "hf", "--merge-adapter", "--max-shard-size", "100KB",
                            "--out", out, "--json", check=True, timeout=600).stdout)
    assert result["adapter"] == "merged" and "model.safetensors.index.json" in result["files"]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = torch.load(probe_path)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=probe["input"]).logits, probe["output"], rtol=0, atol=1e-5)

    # the checkpoint holds the adapter as PEFT's own files (its ZeRO-3 partitions gathered on rank 0): on the
    # frozen base (the unmerged export's base/), PeftModel.from_pretrained(base, CKPT) gives the same logits
    from peft import PeftModel

    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in Path(ckpt["path"]).iterdir()}
    folder = json.loads(cli("export", ckpt["path"], "--format", "hf", "--out", tmp_path / "adapter", "--json",
                            check=True, timeout=600).stdout)
    assert folder["adapter"] == "folder", folder
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter" / "base")
    with_adapter = PeftModel.from_pretrained(base, ckpt["path"]).eval()
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(input_ids=probe["input"]).logits, probe["output"], rtol=0, atol=1e-5)


def test_trainer_checkpoints_reach_storage_and_a_killed_worker_resumes_from_the_last(cli, tmp_path):
    # ZeRO-3 with raytrain's checkpoint flags: the Trainer saves checkpoint-4/-8/-10 (--save_steps 4 and the
    # end), each rank's files (its ZeRO shards) reach the run's storage with raytrain's markers; rank 1 dies
    # after step 6 and Ray Train restarts the workers from the step-4 checkpoint (resume_from_checkpoint); the
    # last checkpoint (ZeRO-3 shards only: no consolidated weights) exports to a folder with the final logits.
    # Then `--resume` of its step-8 checkpoint on 1 worker: the ZeRO state is resharded (DeepSpeed universal
    # checkpoint) and steps 9-10 repeat the saved run's losses.
    saving = [a for a in TRAINER_ARGS if a not in ("--save_strategy", "no")]  # --checkpoint-every says when
    probe = tmp_path / "probe.pt"
    job, out, log = run_trainer(cli, "--zero", "3", "--micro-batch", "2", "--checkpoint-every", "4", "--keep", "2",
                                "--max-failures", "1",
                                script_args=["--fail_once_at_step", "6", "--probe_out", probe, "--dropout", "0"],
                                trainer_args=saving)
    status = cli.json("jobs", "status", job)
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    facts = cli.facts(job)
    # global_step continues from the checkpoint: steps 5-6 redone, not a restart from 0
    assert [m["step"] for m in facts.metrics] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10], facts.metrics
    assert facts.checkpoints == [4, 8, 10], facts.checkpoints
    assert "rank 1: simulated crash after step 6" in log
    assert "raytrain: the Trainer resumes from step 4" in log and "hf_trainer resumed at global_step 4" in log
    assert "hf_trainer done: world 2, zero 3, micro 2, accum 1, clip 1, bf16 False, steps 10" in log, log
    listed = json.loads(cli("jobs", "checkpoints", job, "--json", check=True).stdout)
    assert [c["step"] for c in listed] == [8, 10] and all(c["complete"] for c in listed), listed  # --keep 2
    files = {p.name for p in Path(listed[-1]["path"]).rglob("*")}
    assert {"trainer_state.json", "latest", "rng_state_0.pth", "rng_state_1.pth"} <= files, files
    assert any("zero_pp_rank_0_" in f for f in files) and any("zero_pp_rank_1_" in f for f in files), files
    assert "loss" in status["last_metrics"] and f"loss {facts.losses[-1]:.4f}" in out  # the progress line
    assert not any(f.startswith("model.safetensors") for f in files), files  # ZeRO-3: the shards hold the weights
    assert_export_gives_the_trained_logits(cli, job, probe, tmp_path / "hf", "--dtype", "fp32")

    # --resume of the step-8 checkpoint (2 workers, ZeRO-3) on 1 worker, the global batch kept (micro 2 x
    # grad-accum 2): the same weights, optimizer state and data order, so steps 9 and 10 give the saved run's
    # losses (fp32, no dropout: one rank's RNG stream cannot replay two ranks' masks; 2 ranks' gradient sum vs
    # one rank's accumulation differ in rounding only: rel 1e-4)
    resumed, out1, log1 = run_trainer(cli, "--zero", "3", "--micro-batch", "2", "--grad-accum", "2", "--resume",
                                      listed[0]["path"], script_args=["--dropout", "0"], workers=1)
    assert "checkpoint saved by 2 worker(s), this run has 1: resharding ZeRO state" in log1, log1
    assert "raytrain: the Trainer resumes from step 8" in log1, log1
    assert "hf_trainer done: world 1, zero 3, micro 2, accum 2, clip 1, bf16 False, steps 10" in log1, log1
    again = cli.facts(resumed)
    assert [m["step"] for m in again.metrics] == [9, 10], again.metrics
    saved = {m["step"]: m["loss"] for m in facts.metrics}
    assert again.losses == pytest.approx([saved[9], saved[10]], rel=1e-4), (again.losses, saved)
