"""Tokens/s and model FLOPs utilisation of a ~350M-parameter GPT on one GPU, bf16, ZeRO-2, SDPA flash
attention, eager and torch.compile; peak memory against raytrain's planner.

    python bench/gpu_mfu.py                          # one GPU: eager, then torch.compile (under 5 min on an H200)
    python bench/gpu_mfu.py --compile off            # eager only
    python bench/gpu_mfu.py --device cpu --tiny      # smoke path on CPU: a few steps of a tiny model

One process, no Ray: a single-rank process group (NCCL on a GPU, gloo on CPU) and a DeepSpeed engine built
by ``raytrain.runtime.worker.engine.build_engine`` from the DeepSpeed dict ``raytrain.config.resolve`` makes for
``--zero 2 --precision bf16`` (this file is also a raytrain job: ``raytrain submit bench/gpu_mfu.py
--gpus-per-worker 1 --zero 2 --precision bf16``), with a client ``torch.optim.AdamW(fused=True)`` so that
DeepSpeed compiles no op.

The model: GPT-2-medium shape (24 layers, hidden 1024, 16 heads, vocab 50304, tied output layer: 355M
parameters), sequence 1024, synthetic tokens made on the device. FLOPs per token (PaLM, appendix B):
``6N + 12 L H Q T`` with N the parameters without the position embeddings, L layers, H heads, Q head size,
T sequence (full attention counted, as PaLM does, although causal attention skips half). MFU = FLOPs per
token x tokens/s / the GPU's peak dense bf16 FLOP/s from raytrain's PEAK_TFLOPS by device name (``--peak-tflops`` for
other GPUs). Peak memory is ``torch.cuda.max_memory_allocated`` from model creation to the last step, set
against the planner's ``allocated`` (``raytrain.planner.memory.estimate``, flash attention).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import socket
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raytrain.runtime.worker.throughput import peak_tflops  # noqa: E402  (raytrain's one peak table)


def peak_flops(device_name: str) -> float | None:
    tflops = peak_tflops(device_name)
    return tflops * 1e12 if tflops else None


# -- the model -------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash attention where available
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


SHAPES = {
    "350m": dict(layers=24, hidden=1024, heads=16, vocab=50304, seq=1024, micro_batch=16),
    "tiny": dict(layers=2, hidden=64, heads=4, vocab=256, seq=64, micro_batch=2),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
    p.add_argument("--tiny", action="store_true", help="a tiny model and few steps (the CPU smoke path)")
    for key in ("layers", "hidden", "heads", "vocab", "seq", "micro_batch"):
        p.add_argument("--" + key.replace("_", "-"), type=int, default=None, help=f"default {SHAPES['350m'][key]}")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--zero", type=int, choices=[1, 2, 3], default=2, help="ZeRO stage (default %(default)s)")
    p.add_argument("--steps", type=int, default=None, help="measured optimizer steps (default 30; --tiny 3)")
    p.add_argument("--warmup", type=int, default=None, help="steps before measuring (default 5; --tiny 1)")
    p.add_argument("--compile", choices=["off", "on", "both"], default=None,
                   help="torch.compile the model: both = eager then compiled (default on a GPU; off on CPU)")
    p.add_argument("--fp16-steps", type=int, default=None,
                   help="then an fp16 run of this many steps (eager): DeepSpeed's dynamic loss scaling with raytrain's "
                        "fp16 settings, its scale and overflow-skipped steps per step (default 40 on a GPU; fp16 "
                        "needs one)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the eager bf16 variant's timed steps, profile this many more with torch.profiler: "
                        "device time by kind of kernel (matmul, attention, optimizer, loss, copies, other) and how "
                        "busy the device was (default 0: off)")
    p.add_argument("--budget-s", type=float, default=285.0,
                   help="skip the compiled variant when less than 150 s of this budget is left (default %(default)s)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak dense bf16 TFLOP/s (unknown GPUs)")
    p.add_argument("--out", default="bench/results/gpu_mfu.json")
    return p


def settings(argv: list[str] | None) -> argparse.Namespace:
    a = parser().parse_args(argv)
    shape = SHAPES["tiny" if a.tiny else "350m"]
    for key, value in shape.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.steps = a.steps or (3 if a.tiny else 30)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 5)
    a.compile = a.compile or ("both" if a.device == "cuda" else "off")
    if a.fp16_steps is None:
        a.fp16_steps = 40 if a.device == "cuda" else 0
    return a


# -- FLOPs and the planner ------------------------------------------------------------------------------
def flops_per_token(model: GPT, a) -> tuple[int, int]:
    """(6N + 12 L H Q T, N): N without the position embeddings (the tied output layer counted once)."""
    n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    return 6 * n + 12 * a.layers * a.heads * (a.hidden // a.heads) * a.seq, n


def planner_estimate(model: GPT, a, precision: str = "bf16") -> dict:
    from raytrain.planner.memory import Layout, estimate
    from raytrain.planner.meta import count_parameters, largest_layer

    est = estimate(
        Layout(zero=a.zero, precision=precision), params=count_parameters(model),
        largest_layer=largest_layer(model)[0], gpus=1, gpus_per_node=1, seq=a.seq, micro_batch=a.micro_batch,
        layers=a.layers, hidden=a.hidden, heads=a.heads, vocab=a.vocab, flash_attention=True, grad_accum=a.grad_accum,
    )
    return {"allocated": est.allocated, "gpu_total": est.gpu_total, "model_states": est.states.gpu_total,
            "activations": est.activations, "buffers": est.buffers}


def deepspeed_config(a, precision: str = "bf16") -> dict:
    """The DeepSpeed dict raytrain resolves for --zero ZERO --precision PRECISION and this batch."""
    from raytrain.config import Options, resolve

    plan = resolve(Options(job=str(Path(__file__).resolve()), script=False, workers=1,
                           gpus_per_worker=1 if a.device == "cuda" else 0, zero=a.zero, precision=precision,
                           micro_batch=a.micro_batch, grad_accum=a.grad_accum))
    return plan.deepspeed


# -- one process group, one engine ------------------------------------------------------------------------
def init_single_rank(device: str) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A world of one rank meets only itself, on loopback: an inherited MASTER_ADDR/MASTER_PORT (a shell inside
    # another job, a launcher's leftovers) would make it wait for a rendezvous that never comes.
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ[key] = value
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)


def flash_attention_works(a, device) -> bool:
    """Whether SDPA's flash kernel takes this shape in bf16 here (else SDPA picks another kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, a.heads, a.seq, a.hidden // a.heads, device=device, dtype=torch.bfloat16, requires_grad=True)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        return True
    except RuntimeError as exc:
        print(f"gpu_mfu: SDPA flash attention unavailable ({str(exc).splitlines()[0][:200]}); using SDPA's choice",
              file=sys.stderr)
        return False


def run_variant(a, config: dict, compiled: bool, precision: str = "bf16", steps: int | None = None,
                profile_steps: int = 0) -> dict:
    """One engine, ``a.warmup`` then ``steps`` (default ``a.steps``) timed optimizer steps. On a GPU, raytrain's
    NVML sampler (the one every GPU worker runs) reads the device's memory meanwhile; an fp16 engine's loss
    scale and skipped steps are read after every step with the reporter's own ``loss_scaling``."""
    from raytrain.runtime.worker.engine import build_engine
    from raytrain.runtime.worker.memory_monitor import MemoryMonitor
    from raytrain.runtime.worker.reporter import loss_scaling

    steps = a.steps if steps is None else steps

    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    at_start = torch.cuda.memory_allocated() if cuda else 0  # left over by an earlier variant, if anything
    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(a.vocab, a.hidden, a.layers, a.heads, a.seq)
    fpt, n_params = flops_per_token(model, a)
    params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them to empty tensors
    estimate = planner_estimate(model, a, precision)
    monitor = MemoryMonitor(interval=0.2, gpu=True).start() if cuda else None

    def optimizer(params):
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=3e-4, fused=cuda)

    engine = build_engine(model, optimizer=optimizer, config=config, lr_scheduler=None, model_parameters=None)
    compile_s = None
    if compiled:
        engine.compile()  # DeepSpeed's: nn.Module.compile in place, inductor; the first steps pay for it
    attention, backends = "sdpa", None
    if cuda and flash_attention_works(a, device):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        attention = "sdpa flash"

    def step(i: int) -> float:
        total = 0.0
        for micro in range(a.grad_accum):
            g = torch.Generator(device=device).manual_seed(i * 1000 + micro)
            toks = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), device=device, generator=g)
            logits = engine(toks[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), toks[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        return total

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if backends is not None:
        backends.__enter__()
    try:
        scaling: list[dict] = []  # fp16: after each step, the scale and the steps skipped so far

        def record(i: int, loss) -> None:
            state = loss_scaling(engine)
            if state:
                scaling.append({"step": i + 1, "loss": round(float(loss) / a.grad_accum, 4), **state})

        t = time.perf_counter()
        loss = None
        for i in range(a.warmup):
            loss = step(i)
            record(i, loss)
        sync()
        warmup_s = time.perf_counter() - t
        if compiled:
            compile_s = round(warmup_s, 1)
        times = []
        t0 = time.perf_counter()
        for i in range(a.warmup, a.warmup + steps):
            ts = time.perf_counter()
            loss = step(i)
            sync()
            times.append(time.perf_counter() - ts)
            if scaling:  # float(loss) syncs: outside the timed part
                record(i, loss)
        elapsed = time.perf_counter() - t0
        profiled = None
        if profile_steps:
            try:
                profiled = profile(step, sync, profile_steps, a.warmup + steps, cuda)
            except Exception as exc:  # a profiler that fails here costs the profile, not the measured results
                profiled = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        if backends is not None:
            backends.__exit__(None, None, None)
    tokens = steps * a.micro_batch * a.grad_accum * a.seq
    tokens_per_s = tokens / elapsed
    if cuda:
        peak_mem = torch.cuda.max_memory_allocated()
        peak_reserved = torch.cuda.max_memory_reserved()
        memory_kind = "torch.cuda.max_memory_allocated"
    else:
        import resource

        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak_reserved = None
        memory_kind = "process max RSS (CPU)"
    nvml = monitor.stop() if monitor is not None else None
    result = {
        "variant": ("torch.compile" if compiled else "eager") + (" fp16" if precision == "fp16" else ""),
        "precision": precision,
        "attention": attention,
        "params": params,
        "params_for_flops": n_params,
        "flops_per_token": fpt,
        "tokens_per_step": a.micro_batch * a.grad_accum * a.seq,
        "warmup_s": round(warmup_s, 2),
        "compile_and_warmup_s": compile_s,
        "step_s_median": sorted(times)[len(times) // 2],
        "step_s_mean": elapsed / steps,
        "steps": steps,
        "tokens_per_s": tokens_per_s,
        "model_flops_per_s": fpt * tokens_per_s,
        "final_loss": float(loss) if loss is not None else None,
        "peak_memory_bytes": int(peak_mem),
        "peak_memory_kind": memory_kind,
        "peak_reserved_bytes": peak_reserved,
        "nvml": nvml,  # raytrain's sampler: device-wide used (CUDA context and allocator cache included)
        "allocated_at_start_bytes": at_start,
        "planner": estimate,
        "planner_over_measured": round(estimate["allocated"] / peak_mem, 3) if cuda and peak_mem else None,
        "planner_gpu_total_over_nvml": (round(estimate["gpu_total"] / nvml["gpu_memory_used_peak"], 3)
                                        if nvml and nvml.get("gpu_memory_used_peak") else None),
        "loss_scaling": scaling_summary(scaling) if scaling else None,
        "profile": profiled,
    }
    # DeepSpeed's gradient hooks live on autograd's C++ nodes and point back at its optimizer: a cycle the
    # garbage collector cannot see, so without destroy() the whole engine (parameters, fp32 master copy,
    # Adam moments: 5 GiB here) outlives it and counts in the next variant's peak.
    model_ref = weakref.ref(model)
    engine.destroy()
    del engine, model, step, record
    if compiled:
        torch._dynamo.reset()  # compiled graphs hold the module too
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    result["engine_released"] = model_ref() is None
    result["allocated_after_bytes"] = torch.cuda.memory_allocated() if cuda else None
    return result


KERNEL_KINDS = [  # first match wins (flash attention kernels are CUTLASS kernels too)
    ("attention", r"flash|fmha|sdpa|attention"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_"),
    ("loss", r"cross_entropy|log_softmax|nll_loss"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|wgmma|sm90_|aten::mm|aten::addmm|aten::bmm|aten::matmul|aten::linear"),
    ("communication", r"nccl|all_?reduce|reduce_?scatter|all_?gather|broadcast|gloo"),
    ("copies", r"memcpy|memset|copy|aten::cat|aten::to\b|_to_copy|flatten|unflatten"),
]


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, low)), "other")


def profile(step, sync, steps: int, first: int, cuda: bool) -> dict:
    """``steps`` more steps under torch.profiler: on a GPU, the kernels' device time by kind and the share of
    the wall time the device had any kernel running (the rest: launch overhead, host work, syncs); on CPU,
    the operators' own CPU time by kind (the smoke path)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    t = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        for i in range(first, first + steps):
            step(i)
        sync()
    wall_us = (time.perf_counter() - t) * 1e6
    if cuda:
        events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        spans = [(e.time_range.start, e.time_range.end, e.name) for e in events]
    else:  # CPU operators' self time, laid end to end (no overlap on one intra-op thread)
        spans = [(0.0, e.self_cpu_time_total, e.name) for e in prof.events() if e.self_cpu_time_total > 0]
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for start, end, name in spans:
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + (end - start)
        by_name[name] = by_name.get(name, 0.0) + (end - start)
    total = sum(by_kind.values()) or 1.0
    busy = None
    if cuda:  # the union of the kernels' intervals
        busy, reach = 0.0, float("-inf")
        for start, end, _ in sorted(spans):
            if end > reach:
                busy += end - max(start, reach)
                reach = end
    return {
        "steps": steps, "source": "CUDA kernels" if cuda else "CPU operators (self time)",
        "wall_ms_per_step": round(wall_us / 1e3 / steps, 2),
        "device_busy_fraction": round(busy / wall_us, 3) if busy is not None else None,
        "ms_per_step_by_kind": {k: round(v / 1e3 / steps, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "share_by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:160], "kind": kernel_kind(n), "ms_per_step": round(v / 1e3 / steps, 2)}
                for n, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]],
    }


def scaling_summary(scaling: list[dict]) -> dict:
    """What fp16's dynamic loss scaling did: the scale at the start and end, the steps it skipped (a gradient
    overflow: the scale halves and the optimizer step is not applied) and the per-step trace."""
    skipped = scaling[-1].get("skipped_steps")
    skipped_at = [s["step"] for prev, s in zip([{"skipped_steps": 0}] + scaling, scaling)
                  if s.get("skipped_steps", 0) > prev.get("skipped_steps", 0)]
    return {"first_scale": scaling[0].get("loss_scale"), "last_scale": scaling[-1].get("loss_scale"),
            "skipped_steps": skipped, "skipped_at": skipped_at, "first_loss": scaling[0]["loss"],
            "last_loss": scaling[-1]["loss"], "trace": scaling}


def size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    a = settings(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_mfu: --device cuda but torch sees no GPU; use --device cpu --tiny for the smoke path", file=sys.stderr)
        return 2
    if a.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if a.hidden % a.heads:
        print(f"gpu_mfu: --hidden {a.hidden} is not divisible by --heads {a.heads}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU"
    peak = a.peak_tflops * 1e12 if a.peak_tflops else (peak_flops(name) if a.device == "cuda" else None)
    if a.device == "cuda" and peak is None:
        print(f"gpu_mfu: no peak bf16 FLOP/s for {name!r} in PEAK_TFLOPS: MFU is not computed; pass "
              f"--peak-tflops (the data sheet's dense bf16 tensor TFLOP/s) to get it", file=sys.stderr)
    init_single_rank(a.device)
    config = deepspeed_config(a)
    from raytrain.nvml import gpu_inventory

    gpus = gpu_inventory() if a.device == "cuda" else []  # what `raytrain gpus` and the capacity check read
    variants = {"off": [False], "on": [True], "both": [False, True]}[a.compile]
    results, notes = [], []
    for compiled in variants:
        left = a.budget_s - (time.monotonic() - started)
        if compiled and len(variants) > 1 and left < 150:
            notes.append(f"torch.compile variant skipped: {left:.0f} s of the {a.budget_s:.0f} s budget left")
            continue
        r = run_variant(a, config, compiled, profile_steps=0 if compiled else a.profile_steps)
        r["mfu"] = r["model_flops_per_s"] / peak if peak else None
        results.append(r)
        if r["allocated_at_start_bytes"] > 2**27:
            notes.append(f"{r['variant']}: {r['allocated_at_start_bytes'] / 2**30:.2f} GiB were still allocated when it "
                         "started (left by the previous variant) and count in its peak")
        print(f"gpu_mfu: {r['variant']}: {r['tokens_per_s']:,.0f} tokens/s"
              + (f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""), file=sys.stderr, flush=True)

    if a.fp16_steps and a.device != "cuda":
        notes.append("fp16 variant skipped: DeepSpeed refuses fp16 on CPU (raytrain refuses --precision fp16 "
                     "without GPU workers)")
    elif a.fp16_steps:
        r = run_variant(a, deepspeed_config(a, "fp16"), compiled=False, precision="fp16", steps=a.fp16_steps)
        r["mfu"] = r["model_flops_per_s"] / peak if peak else None  # fp16 dense peak = bf16's on these GPUs
        results.append(r)
        ls = r["loss_scaling"] or {}
        print(f"gpu_mfu: {r['variant']}: {r['tokens_per_s']:,.0f} tokens/s; loss scale {ls.get('first_scale')} -> "
              f"{ls.get('last_scale')}, {ls.get('skipped_steps')} step(s) skipped on overflow, loss "
              f"{ls.get('first_loss')} -> {ls.get('last_loss')}", file=sys.stderr, flush=True)

    for r in results:
        if not r["engine_released"]:
            notes.append(f"{r['variant']}: the engine was still alive after engine.destroy() and del: later variants' "
                         "peaks include it")
    cpu_note = ("MFU on CPU is not meaningful: there is no peak FLOP/s for a CPU here and this path only "
                "exercises the code (a tiny model, a few steps)") if a.device == "cpu" else None
    out = {
        "benchmark": "gpu_mfu", "device": name, "peak_bf16_flops": peak,
        "shape": {k: getattr(a, k) for k in ("layers", "hidden", "heads", "vocab", "seq", "micro_batch", "grad_accum")},
        "steps": a.steps, "warmup": a.warmup, "deepspeed": config, "gpus": gpus,
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "results": results, "notes": notes + ([cpu_note] if cpu_note else []),
        "duration_s": round(time.monotonic() - started, 1),
    }
    path = Path(a.out) if Path(a.out).is_absolute() else ROOT / a.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))

    p0 = results[0]["params"] if results else 0
    print(f"## GPT {p0 / 1e6:.{0 if p0 >= 1e8 else 2}f}M parameters, seq {a.seq}, micro-batch {a.micro_batch} x grad-accum {a.grad_accum}, "
          f"ZeRO-{a.zero}, on {name}" + (f" (peak {peak / 1e12:.0f} TFLOP/s bf16 dense)" if peak else "") + "\n")
    print("| variant | attention | step | tokens/s | model TFLOP/s | MFU | peak memory | planner estimate | "
          "estimate/measured | NVML peak used | planner GPU total |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else ("n/a (CPU)" if a.device == "cpu" else "n/a (unknown GPU)")
        est = r["planner"]["allocated"]
        print(f"| {r['variant']} | {r['attention']} | {r['step_s_median'] * 1000:.1f} ms | {r['tokens_per_s']:,.0f} | "
              f"{r['model_flops_per_s'] / 1e12:.{1 if a.device == 'cuda' else 4}f} | {mfu} | {size(r['peak_memory_bytes'])}"
              f"{'' if a.device == 'cuda' else ' (RSS)'} | {size(est)} | "
              f"{r['planner_over_measured'] if r['planner_over_measured'] is not None else 'n/a'} | "
              f"{size(r['nvml']['gpu_memory_used_peak']) if r['nvml'] and r['nvml'].get('gpu_memory_used_peak') else 'n/a'} | "
              f"{size(r['planner']['gpu_total'])} |")
    for r in results:
        ls = r.get("loss_scaling")
        if ls:
            print(f"\n{r['variant']}: dynamic loss scale {ls['first_scale']:g} -> {ls['last_scale']:g}; "
                  f"{ls['skipped_steps']} of {a.warmup + r['steps']} steps skipped on overflow (at steps "
                  f"{ls['skipped_at'] or 'none'}); loss {ls['first_loss']} -> {ls['last_loss']}")
    for r in results:
        pr = r.get("profile")
        if pr and "error" in pr:
            print(f"\n{r['variant']} profile failed: {pr['error']}")
        elif pr:
            kinds = ", ".join(f"{k} {v:.1%}" for k, v in pr["share_by_kind"].items())
            busy = (f"device busy {pr['device_busy_fraction']:.1%} of {pr['wall_ms_per_step']} ms/step; "
                    if pr["device_busy_fraction"] is not None else "")
            print(f"\n{r['variant']} profile ({pr['steps']} steps, {pr['source']}): {busy}{kinds}")
            for k in pr["top"][:8]:
                print(f"  {k['ms_per_step']:8.2f} ms/step  {k['kind']:<13} {k['name'][:110]}")
    for note in out["notes"]:
        print(f"\nNOTE: {note}")
    print(f"\nFLOPs/token = 6N + 12·L·H·Q·T = {results[0]['flops_per_token'] / 1e9:.3f} GFLOP (N = "
          f"{results[0]['params_for_flops'] / 1e6:.1f}M without position embeddings); total {out['duration_s']:.0f} s; "
          f"JSON: {path}" if results else f"no results; JSON: {path}")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if results else 1


# -- as a raytrain job -----------------------------------------------------------------------------------
def train(ctx):
    """The same model through raytrain: ``raytrain submit bench/gpu_mfu.py --gpus-per-worker 1 --zero 2
    --precision bf16 -- [--tiny] [--steps N]`` (reports tokens/s per step)."""
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(ctx.args)
    shape = SHAPES["tiny" if args.tiny else "350m"]
    torch.manual_seed(0)
    model = GPT(shape["vocab"], shape["hidden"], shape["layers"], shape["heads"], shape["seq"])
    engine = ctx.deepspeed(model, lr=3e-4)
    for step in range(ctx.start_step, args.steps):
        for micro in range(ctx.grad_accum):
            toks = torch.randint(0, shape["vocab"], (ctx.micro_batch, shape["seq"] + 1), device=ctx.device)
            logits = engine(toks[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, shape["vocab"]), toks[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
        ctx.report({"loss": loss, "tokens": ctx.train_batch * shape["seq"]})


if __name__ == "__main__":
    sys.exit(main())
