"""What a step's throughput means: tokens/s when the job says how many tokens a sample holds, TFLOP/s per GPU
and MFU (against the GPU's dense bf16/fp16 peak) on GPU workers when it says how many FLOPs a sample costs,
and the run's length (``total_steps``) for the progress bar's ETA."""
from __future__ import annotations

from typing import Any

# Dense bf16/fp16 tensor-core peak, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
               "L40": 181.0, "L4": 121.0, "A10": 125.0, "V100": 125.0, "T4": 65.0, "MI300": 1307.0}


def steps_from_args(args: list[str]) -> int | None:
    """The run's length from a ``--steps N`` (or ``--steps=N``) job argument, else None."""
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--steps" and i + 1 < len(args) else arg[8:] if arg.startswith("--steps=") else None
        if value is not None and value.isdigit():
            return int(value)
    return None


def peak_tflops(device_name: str) -> float | None:
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_TFLOPS[key]
    return None


def derived(metrics: dict[str, Any], *, tokens_per_sample: float | None, flops_per_sample: float | None,
            world_size: int, gpu_peak_tflops: float | None, on_gpu: bool) -> dict[str, float]:
    """tokens_per_s, tflops_per_gpu and mfu from a report's samples_per_s (what the job told is known)."""
    out: dict[str, float] = {}
    rate = metrics.get("samples_per_s")
    if not isinstance(rate, (int, float)) or rate <= 0:
        return out
    if tokens_per_sample:
        out["tokens_per_s"] = round(rate * tokens_per_sample, 1)
    if flops_per_sample and on_gpu:
        per_gpu = rate * flops_per_sample / 1e12 / max(world_size, 1)
        out["tflops_per_gpu"] = round(per_gpu, 3)
        if gpu_peak_tflops:
            out["mfu"] = round(per_gpu / gpu_peak_tflops, 4)
    return out
