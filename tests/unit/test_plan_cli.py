"""`raytrain plan` through click's CliRunner on raytrain.cli.main:main. No Ray, no GPU."""
import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.planner import search
from raytrain.planner.shape import shape_from_numbers
from tests.conftest import JOBS, ROOT

FLAGS = ["--params", "7e9", "--layers", "32", "--hidden", "4096", "--seq", "2048", "--micro-batch", "4",
         "--gpus", "8", "--gpu-memory", "80GB"]


def run(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)])


def test_json_plan_matches_the_library():
    result = run(*FLAGS, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    lib = search.plan(
        shape_from_numbers(7 * 10**9, layers=32, hidden=4096, seq=2048),
        search.make_hardware(8, 80 * 10**9), seq=2048, micro_batch=4,
    )
    assert out["model"]["params"] == 7 * 10**9
    assert out["hardware"] == {"gpus": 8, "gpus_per_node": 8, "nodes": 1, "gpu_memory": 80 * 10**9,
                               "cpu_memory_per_node": None}
    assert len(out["candidates"]) == len(lib.candidates)
    chosen = out["chosen"]
    assert chosen == lib.chosen.to_dict()
    assert chosen["fits"] and chosen["gpu"]["total"] <= out["usable_gpu_memory"] == 72 * 10**9
    parts = chosen["gpu"]
    assert parts["total"] == parts["allocated"] + parts["overhead"]
    # The peak: the gradients not accumulated across micro-batches are not live with the activations
    # (no --grad-accum given: they are counted as accumulated, so only the fp32 copy overlaps)
    persistent = parts["params"] + parts["optimizer"] + parts["zero3_working_set"] + parts["buffers"] + parts["grads"]
    assert parts["allocated"] == persistent + max(parts["activations"], parts["grad_fp32"])
    assert out["workload"]["grad_accum"] is None
    one = json.loads(run(*FLAGS, "--grad-accum", "1", "--json").output)
    p1 = next(c["gpu"] for c in one["candidates"] if c["zero"] == chosen["zero"] and c["tp"] == chosen["tp"]
              and c["pp"] == chosen["pp"] and c["offload"] == chosen["offload"]
              and c["checkpointing"] == chosen["checkpointing"])
    assert p1["allocated"] == persistent - parts["grads"] + max(parts["activations"], parts["grads"] + parts["grad_fp32"])
    assert p1["allocated"] <= parts["allocated"] and one["workload"]["grad_accum"] == 1
    bad = run(*FLAGS, "--grad-accum", "0")
    assert bad.exit_code != 0 and "--grad-accum 0" in bad.output


def test_table_marks_the_choice():
    result = run(*FLAGS)
    assert result.exit_code == 0, result.output
    assert "CHOSEN" in result.output
    assert "chosen: ZeRO-" in result.output
    assert "usable 72.0 GB per GPU" in result.output


def test_restricting_choices():
    result = run(*FLAGS, "--zero", "3", "--offload", "none,optimizer", "--tp", "1", "--json")
    assert result.exit_code == 0, result.output
    configs = {(c["zero"], c["offload"], c["tp"]) for c in json.loads(result.output)["candidates"]}
    assert configs == {(3, "none", 1), (3, "optimizer", 1)}


def test_nothing_fits_says_so_and_json_has_no_choice():
    result = run(*FLAGS[:-1], "2GB")
    assert result.exit_code == 0, result.output
    assert "nothing fits" in result.output
    assert json.loads(run(*FLAGS[:-1], "2GB", "--json").output)["chosen"] is None


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--gpu-memory", "lots"], "--gpu-memory"),
        (["--params", "many"], "--params"),
        (["--params", "-7e9"], "--params"),
        (["--heads", "3"], "--heads"),
        (["--zero", "5"], "--zero"),
        (["--offload", "disk"], "--offload"),
        (["--precision", "int4"], "--precision"),
        (["--tp", "3"], "--tp"),
        (["--gpus-per-node", "3"], "--gpus-per-node"),
        (["--margin", "1.5"], "--margin"),
        (["--micro-batch", "0"], "--micro-batch"),
        (["--zero", "2", "--offload", "all"], "--offload"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(args, flag):
    base = dict(zip(FLAGS[::2], FLAGS[1::2]))
    for name, value in zip(args[::2], args[1::2]):
        base[name] = value
    result = run(*[x for kv in base.items() for x in kv])
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_without_params_or_job_names_params():
    result = run("--gpus", "8", "--gpu-memory", "80GB")
    assert result.exit_code == 2 and "--params" in result.output


def test_without_gpu_memory_and_no_local_gpu_names_gpu_memory(monkeypatch):
    monkeypatch.setattr("raytrain.cli.memory_plan._local_gpus", lambda: [])
    result = run("--params", "7e9")
    assert result.exit_code == 2 and "--gpu-memory" in result.output


def test_gpu_memory_and_count_default_to_the_local_gpus(monkeypatch):
    gpu = {"name": "NVIDIA H200", "memory_total": 150_754_820_096}
    monkeypatch.setattr("raytrain.cli.memory_plan._local_gpus", lambda: [gpu, gpu])
    out = json.loads(run("--params", "7e9", "--json").output)
    assert out["hardware"]["gpus"] == 2 and out["hardware"]["gpu_memory"] == 150_754_820_096
    assert any("NVIDIA H200" in n for n in out["notes"])


JOB = textwrap.dedent(
    f"""
    import argparse, sys
    sys.path.insert(0, {str(JOBS)!r})
    from gpt_zero import GPT

    def model(args):
        p = argparse.ArgumentParser()
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--dim", type=int, default=64)
        a = p.parse_args(args)
        return GPT(128, a.dim, a.layers, 4, 32)

    def train(ctx):
        pass
    """
)


def test_job_file_is_counted_on_the_meta_device(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    result = run(job, "--seq", "32", "--gpus", "2", "--gpu-memory", "1GB", "--json", "--", "--layers", "3")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    sys.path.insert(0, str(JOBS))
    try:
        from gpt_zero import GPT
    finally:
        sys.path.remove(str(JOBS))
    real = GPT(128, 64, 3, 4, 32)
    assert out["model"]["params"] == sum(p.numel() for p in real.parameters())
    assert out["model"]["layers"] == 3 and out["model"]["hidden"] == 64
    assert out["model"]["source"].startswith("meta:")
    assert all(c["gpu"]["activations"] is not None for c in out["candidates"])


def test_job_file_and_params_together_is_an_error(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    result = run(job, "--params", "7e9", "--gpu-memory", "80GB")
    assert result.exit_code == 2 and "--params" in result.output


def test_job_file_without_model_function(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("def train(ctx):\n    pass\n")
    result = run(job, "--gpu-memory", "80GB")
    assert result.exit_code == 2 and "model(args)" in result.output


def test_params_path_imports_neither_torch_nor_deepspeed():
    code = textwrap.dedent(
        """
        import sys
        from raytrain.cli.main import main
        try:
            main(["plan", "--params", "7e9", "--layers", "32", "--hidden", "4096", "--seq", "2048",
                  "--gpus", "8", "--gpu-memory", "80GB", "--json"], standalone_mode=False)
        finally:
            print("LOADED", sorted(m for m in ("torch", "deepspeed") if m in sys.modules), file=sys.stderr)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chosen"] is not None
    assert "LOADED []" in proc.stderr
