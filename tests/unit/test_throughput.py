"""Progress with a bar and ETA when the job gives its length; tokens/s; TFLOP/s and MFU only on GPU workers
(issue 17)."""
import io

from rich.console import Console

from raytrain.cli.progress import ProgressPrinter, describe_eta, describe_metrics
from raytrain.events import JobFacts, format_event
from raytrain.runtime.worker.reporter import Reporter
from raytrain.runtime.worker.throughput import derived, peak_tflops, steps_from_args


def test_the_runs_length_comes_from_a_steps_argument():
    assert steps_from_args(["--lr", "1", "--steps", "10"]) == 10
    assert steps_from_args(["--steps=7"]) == 7
    assert steps_from_args(["--steps", "x"]) is None and steps_from_args([]) is None


def test_tflops_and_mfu_only_on_gpu_workers():
    kw = dict(tokens_per_sample=128, flops_per_sample=6e12, world_size=4)
    gpu = derived({"samples_per_s": 40.0}, gpu_peak_tflops=peak_tflops("NVIDIA H100 80GB HBM3"), on_gpu=True, **kw)
    assert gpu == {"tokens_per_s": 5120.0, "tflops_per_gpu": 60.0, "mfu": round(60 / 989, 4)}
    cpu = derived({"samples_per_s": 40.0}, gpu_peak_tflops=None, on_gpu=False, **kw)
    assert cpu == {"tokens_per_s": 5120.0}
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("Some GPU") is None


def test_reporter_adds_total_steps_and_tokens_per_s(capsys):
    r = Reporter(rank=0, train_batch=8)
    r.total_steps, r.tokens_per_sample = 12, 32
    r.report({"loss": 1.0, "step": 1})
    out = r.report({"loss": 0.9, "step": 2})
    assert out["total_steps"] == 12 and out["tokens_per_s"] == round(out["samples_per_s"] * 32, 1)
    assert "tflops_per_gpu" not in out  # CPU worker


def test_progress_shows_a_bar_and_an_eta():
    facts = JobFacts()
    for step in range(1, 4):
        facts.add({"event": "metrics", "step": step, "total_steps": 12, "loss": 2.0, "step_time_s": 2.0,
                   "samples_per_s": 4.0, "tokens_per_s": 128.0, "tflops_per_gpu": 51.2, "mfu": 0.052})
    assert describe_eta(facts) == "[#####...............]  25%  ETA 0:18"
    text = describe_metrics(facts.last_metrics)
    assert text.startswith("step 3/12  loss 2.0000  4.0 samples/s  128 tokens/s  51.2 TFLOP/s per GPU  MFU 5.2%")
    assert describe_eta(JobFacts()) == ""


def test_piped_progress_lines_carry_the_eta():
    buf = io.StringIO()
    with ProgressPrinter(Console(file=buf, force_terminal=False, width=200)) as printer:
        for step in (1, 2):
            printer.on_text(format_event("metrics", step=step, total_steps=4, loss=1.0, step_time_s=1.0) + "\n")
    assert "step 2/4  loss 1.0000  1000 ms/step  ETA 0:02" in buf.getvalue()


def test_one_peak_table_for_raytrain_and_bench():
    """H100 PCIe is 756 TFLOP/s dense bf16 (SXM 989): a more specific name wins, and bench/gpu_mfu.py reads
    the same table (it once had its own, which disagreed)."""
    import importlib.util

    from tests.conftest import ROOT

    assert peak_tflops("NVIDIA H100 PCIe") == 756.0 and peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 NVL") == 835.0 and peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA L4") == 121.0 and peak_tflops("NVIDIA L40") == 181.0
    spec = importlib.util.spec_from_file_location("gpu_mfu_for_peaks", ROOT / "bench" / "gpu_mfu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert not hasattr(bench, "PEAK_BF16")
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "Some GPU"):
        expected = peak_tflops(name)
        assert bench.peak_flops(name) == (expected * 1e12 if expected else None)
