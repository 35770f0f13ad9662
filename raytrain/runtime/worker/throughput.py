"""What a step's throughput means: tokens/s when the job says how many tokens a sample holds, TFLOP/s per GPU
and MFU (against the GPU's dense bf16/fp16 peak) on GPU workers when it says how many FLOPs a sample costs,
and the run's length (``total_steps``) for the progress bar's ETA."""
from __future__ import annotations

import re
from typing import Any

# Dense (no sparsity) bf16/fp16 tensor-core peaks, TFLOP/s, from the vendors' data sheets, by a regular
# expression on torch.cuda.get_device_name(). The one table: bench/gpu_mfu.py imports it. First match wins,
# so a more specific name comes before a name it contains (H100 PCIe before H100).
PEAK_TFLOPS: list[tuple[str, float]] = [
    (r"GB200", 2500.0),
    (r"B200", 2250.0),
    (r"H200 NVL", 835.0),
    (r"GH200|H200", 989.0),
    (r"H100 PCIe", 756.0),
    (r"H100 NVL", 835.0),
    (r"H100|H800", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"H20\b", 148.0),
    (r"A100|A800", 312.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"V100", 125.0),
    (r"\bT4\b", 65.0),
    (r"MI300X?", 1307.0),
    (r"MI250X?", 383.0),
]


def steps_from_args(args: list[str]) -> int | None:
    """The run's length from a ``--steps N`` (or ``--steps=N``) job argument, else None."""
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--steps" and i + 1 < len(args) else arg[8:] if arg.startswith("--steps=") else None
        if value is not None and value.isdigit():
            return int(value)
    return None


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (TFLOP/s), or None for a GPU not in :data:`PEAK_TFLOPS`."""
    for pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return tflops
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
