"""Memory arithmetic for one training configuration. Pure: numbers in, bytes out; no torch, no deepspeed.

Every function returns bytes (int). ``P`` below is the parameter count one model-parallel rank holds,
``P / (tp * pp)``, and ``N`` the data-parallel size ``world / (tp * pp)`` over which ZeRO partitions.

Model states (Rajbhandari et al., "ZeRO", 2020, section 3.1)
    Mixed precision (bf16/fp16) Adam keeps per parameter 2 bytes of 16-bit parameters, 2 bytes of 16-bit
    gradients and K = 12 bytes of optimizer state (fp32 master parameters, momentum, variance): 16 bytes.
    fp32 Adam: 4 (parameters) + 4 (gradients) + 8 (momentum, variance) = 16 bytes, no master copy.
    ZeRO stage 1 divides the optimizer bytes by N, stage 2 the gradient bytes too, stage 3 the parameter
    bytes too; stage 0 is plain data parallelism.

    DeepSpeed also materialises an fp32 copy of each rank's gradient partition for the optimizer step
    (4 bytes/param, partitioned like the optimizer state; ``grad_fp32`` below). Its own estimators count it
    (their "18 = 2 grads16 + 4 grads32 + 4 params32 + 8 optimizer"), so the planner does by default;
    ``fp32_grad_copy=False`` gives the paper's figures.

Offload (ZeRO-Offload / ZeRO-Infinity to CPU memory)
    ``optimizer``: the optimizer state and the fp32 gradient partition live in CPU memory (for fp32 training
    CPU Adam also keeps a 4-byte copy of the parameter partition there); from stage 2 on, the reduced
    16-bit gradient partition goes straight into that CPU buffer, so no gradient partition stays on the
    GPU (stage 1 still holds full 16-bit gradients until the reduction).
    ``all`` (stage 3): the parameter partition moves to CPU as well. This matches what
    ``estimate_zero2/3_model_states_mem_needs`` put on GPU and CPU.

ZeRO-3 working set
    Stage 3 gathers one module's full parameters (and its gradients in backward) at a time:
    ``(param_bytes + grad_bytes) * largest_layer / tp``, 4 bytes per parameter in mixed precision (as in
    DeepSpeed's estimator), 8 in fp32. The "largest layer" is the module with most parameters of its own
    (``recurse=False``), DeepSpeed's definition.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022)
    One transformer layer stores, in 16-bit, ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes (s sequence, b
    micro-batch, h hidden, a heads, t tensor-parallel size, no sequence parallelism): 34 + 5as/h at t = 1.
    ``flash_attention=True`` drops the ``5as/(ht)`` term (fused attention stores no s*s scores).
    Full activation checkpointing keeps each layer's 16-bit input, ``2*s*b*h``, and recomputes one layer at
    a time: ``L * 2sbh + one layer's full activations``. fp32 activations: twice the 16-bit bytes.
    With pipeline parallelism (1F1B) the first stage holds ``pp`` micro-batches of ``L/pp`` layers, so the
    worst stage still holds about ``L`` layers' worth: pp does not divide activations.
    With ``vocab`` known, the output layer adds ``s*b*V/t*(act_bytes + 12)``: the logits (which the training
    loop still holds), the fp32 log-probabilities the loss saves, and in the loss's backward its incoming
    and outgoing fp32 gradients: 14.0 bytes per token and vocabulary entry in bf16, the backward of the loss
    being the step's peak (calibrated with bench/gpu_mfu.py; docs/benchmarks.md).

Buffers and overhead
    ``buffers``: DeepSpeed's gradient reduction bucket, ``min(5e8, P)`` elements of gradient dtype
    (``reduce_bucket_size`` default 5e8). It is allocated through torch, so it counts in
    ``torch.cuda.max_memory_allocated``.
    ``overhead``: what torch's allocator statistics never see: ``CUDA_CONTEXT_BYTES`` (2 GB: CUDA context,
    cuBLAS workspace, NCCL buffers) plus ``FRAGMENTATION`` (10 %; 15 % under ZeRO-3) of everything allocated:
    the caching allocator's reserve above its peak allocation, which grows with the micro-batch's large logits
    tensors and under ZeRO-3, which gathers and frees every parameter in every step (docs/benchmarks.md,
    gpu_mfu.py).

The peak (``allocated``)
    Not every byte above is live at once. The 16-bit gradients and DeepSpeed's fp32 gradient copy fill up
    during backward and at the optimizer step, after the activations are freed; the step's peak is the larger
    of the two phases: ``params + optimizer + buffers + working set + max(activations, grads + grad_fp32)``.
    With gradient accumulation (``grad_accum > 1``, or unknown) the 16-bit gradients are held across
    micro-batches and count in both phases; so they do under ZeRO-3, which allocates its gradient partition
    once for the whole run. Without accumulation the peak is in the loss's backward, before any gradient
    exists. The estimate errs a few percent high, never low (how close: docs/benchmarks.md, gpu_mfu.py).

CPU memory per node
    Offloaded states for every GPU on the node, or the fp32 model each rank builds on CPU before DeepSpeed
    takes it (``4 * P/pp`` bytes per rank; ``4 * largest_layer`` with ``zero.Init``), whichever is larger,
    times ``CPU_BUFFER_FACTOR`` (1.5, DeepSpeed's ``additional_buffer_factor`` for pinned buffers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MIXED_PRECISIONS = ("bf16", "fp16")
PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOADS = ("none", "optimizer", "all")
STAGES = (0, 1, 2, 3)

REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed zero_optimization.reduce_bucket_size default
CUDA_CONTEXT_BYTES = 2_000_000_000
FRAGMENTATION = 0.10
FRAGMENTATION_ZERO3 = 0.15
CPU_BUFFER_FACTOR = 1.5  # DeepSpeed estimators' additional_buffer_factor
BUILD_BYTES_PER_PARAM = 4  # a model built on CPU in fp32 before deepspeed.initialize


@dataclass(frozen=True)
class BytesPerParam:
    param: int
    grad: int
    optimizer: int  # Adam state (and fp32 master parameters in mixed precision)
    grad_fp32: int  # DeepSpeed's fp32 copy of the gradient partition (mixed precision only)
    offload_master: int  # extra parameter copy CPU Adam keeps when the optimizer is offloaded

    @property
    def activation(self) -> int:
        return self.param


MIXED = BytesPerParam(param=2, grad=2, optimizer=12, grad_fp32=4, offload_master=0)
FP32 = BytesPerParam(param=4, grad=4, optimizer=8, grad_fp32=0, offload_master=4)


def bytes_per_param(precision: str) -> BytesPerParam:
    if precision in MIXED_PRECISIONS:
        return MIXED
    if precision == "fp32":
        return FP32
    raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")


COMPONENTS = ("params", "grads", "optimizer", "grad_fp32")


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU rank, by component, on the GPU and in CPU memory (the rank's share)."""

    gpu: dict[str, float]
    cpu: dict[str, float]

    @property
    def gpu_total(self) -> int:
        return int(round(sum(self.gpu.values())))

    @property
    def cpu_total(self) -> int:
        return int(round(sum(self.cpu.values())))


def check_config(stage: int, offload: str, precision: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage {stage!r}: use 0-3")
    if offload not in OFFLOADS:
        raise ValueError(f"offload {offload!r}: use one of {', '.join(OFFLOADS)}")
    if offload != "none" and stage == 0:
        raise ValueError("offload needs ZeRO stage 1-3")
    if offload == "all" and stage != 3:
        raise ValueError("offload 'all' (parameters too) needs ZeRO stage 3")
    bytes_per_param(precision)


def model_states(
    params: float,
    *,
    stage: int,
    precision: str = "bf16",
    offload: str = "none",
    dp: int = 1,
    fp32_grad_copy: bool = True,
    trainable: float | None = None,
) -> ModelStates:
    """Model states per rank for ``params`` parameters (one model-parallel rank's), partitioned over ``dp``.
    ``trainable``: how many of them train (default all); frozen ones (``requires_grad=False``, e.g. a LoRA
    run's base model) hold only their parameter bytes: no gradients, no optimizer state."""
    check_config(stage, offload, precision)
    if dp < 1:
        raise ValueError("dp must be >= 1")
    b = bytes_per_param(precision)
    trained = params if trainable is None else min(float(trainable), float(params))

    def share(nbytes: int, partitioned: bool, count: float = trained) -> float:
        return nbytes * count / dp if partitioned else nbytes * count

    gpu = {
        "params": share(b.param, stage >= 3, params),
        "grads": share(b.grad, stage >= 2),
        "optimizer": share(b.optimizer, stage >= 1),
        "grad_fp32": share(b.grad_fp32, stage >= 1) if fp32_grad_copy else 0.0,
    }
    cpu = dict.fromkeys(COMPONENTS, 0.0)
    if offload in ("optimizer", "all"):
        cpu["optimizer"] = share(b.optimizer + b.offload_master, True)
        gpu["optimizer"] = 0.0
        # The gradient partition CPU Adam reads is fp32 in CPU memory: the fp32 copy in mixed precision,
        # the gradients themselves in fp32 training.
        if b.grad_fp32:
            cpu["grad_fp32"] = share(b.grad_fp32, True)
            gpu["grad_fp32"] = 0.0
            if stage >= 2:
                gpu["grads"] = 0.0
        else:
            cpu["grads"] = share(b.grad, True)
            if stage >= 2:
                gpu["grads"] = 0.0
    if offload == "all":
        cpu["params"] = share(b.param, True, params)
        gpu["params"] = 0.0
    return ModelStates(gpu=gpu, cpu=cpu)


def zero3_working_set(largest_layer: float, *, stage: int, precision: str = "bf16", tp: int = 1) -> int:
    """Stage 3 only: one module's gathered parameters and gradients; 0 for stages 0-2."""
    if stage != 3:
        return 0
    b = bytes_per_param(precision)
    return int(round((b.param + b.grad) * largest_layer / tp))


def activation_memory(
    *,
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    precision: str = "bf16",
    checkpointing: bool = False,
    flash_attention: bool = False,
    vocab: int | None = None,
) -> int:
    """Activation bytes per GPU for a transformer (Korthikanti et al. 2022; see the module docstring)."""
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    scale = 1 if precision in MIXED_PRECISIONS else 2
    attention_scores = 0.0 if flash_attention else 5.0 * a * s / (h * t)
    per_layer = s * b * h * (10.0 + 24.0 / t + attention_scores) * scale
    if checkpointing:
        total = layers * 2.0 * s * b * h * scale + per_layer
    else:
        total = layers * per_layer
    if vocab:
        total += s * b * (vocab / t) * (2 * scale + 12)
    return int(round(total))


def peak_allocated(
    states: ModelStates, *, working_set: float, activations: float | None, buffers: float, grad_accum: int | None,
    stage: int = 2,
) -> int:
    """The bytes live at the step's peak (see "The peak" in the module docstring): activations and the
    gradients not held across micro-batches are never live together. ZeRO-3 allocates its 16-bit gradient
    partition once, for the whole run: always held."""
    g = states.gpu
    grads, grad_fp32 = g.get("grads", 0.0), g.get("grad_fp32", 0.0)
    held = grads if grad_accum is None or grad_accum > 1 or stage == 3 else 0.0
    persistent = g.get("params", 0.0) + g.get("optimizer", 0.0) + working_set + buffers + held
    return int(round(persistent + max(activations or 0.0, grads - held + grad_fp32)))


def reduce_bucket(params: float, precision: str = "bf16") -> int:
    """DeepSpeed's gradient reduction bucket on the GPU."""
    return int(round(min(REDUCE_BUCKET_ELEMENTS, params) * bytes_per_param(precision).grad))


def overhead(allocated: float, stage: int = 2) -> int:
    """Memory the GPU uses beyond torch's allocations: CUDA context and allocator fragmentation (more under
    ZeRO-3, which gathers and frees every parameter in every step)."""
    return int(round(CUDA_CONTEXT_BYTES + (FRAGMENTATION_ZERO3 if stage == 3 else FRAGMENTATION) * allocated))


def cpu_per_node(
    states: ModelStates,
    *,
    gpus_per_node: int,
    build_params: float,
    buffer_factor: float = CPU_BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """(offloaded states on the node, fp32 model build on the node, total with the buffer factor)."""
    offloaded = states.cpu_total * gpus_per_node
    build = BUILD_BYTES_PER_PARAM * build_params * gpus_per_node
    return int(round(offloaded)), int(round(build)), int(round(max(offloaded, build) * buffer_factor))


def checkpoint_snapshot(rank_params: float, *, stage: int, precision: str, dp: int, trainable: float | None = None) -> int:
    """Host memory one rank's async checkpoint snapshot holds (``--checkpoint-mode async``): what its files
    hold. The model states file (parameters, in the training dtype; written by data-parallel rank 0, the
    largest) and the optimizer state with its fp32 master copy, partitioned over ``dp`` from ZeRO stage 1."""
    b = bytes_per_param(precision)
    trained = rank_params if trainable is None else min(float(trainable), float(rank_params))
    per_param = b.optimizer
    if b is FP32 and stage >= 1:  # a ZeRO optimizer saves its fp32 partition beside Adam's two moments
        per_param += 4
    optimizer = per_param * trained
    return int(round(b.param * rank_params + optimizer / (dp if stage >= 1 else 1)))


@dataclass(frozen=True)
class Layout:
    """One candidate configuration."""

    zero: int
    offload: str = "none"
    tp: int = 1
    pp: int = 1
    precision: str = "bf16"
    checkpointing: bool = False


@dataclass(frozen=True)
class Estimate:
    config: Layout
    dp: int
    states: ModelStates
    zero3_working_set: int
    activations: int | None  # None: not estimated (model shape or sequence unknown)
    buffers: int
    allocated: int  # what torch.cuda.max_memory_allocated would see at the peak
    overhead: int
    gpu_total: int
    cpu_offloaded_per_node: int
    cpu_build_per_node: int
    cpu_per_node: int
    checkpoint_snapshot: int = 0  # host memory of one rank's async checkpoint snapshot (the largest rank's)

    def to_dict(self) -> dict:
        c = self.config
        return {
            "zero": c.zero,
            "offload": c.offload,
            "tp": c.tp,
            "pp": c.pp,
            "dp": self.dp,
            "precision": c.precision,
            "checkpointing": c.checkpointing,
            "gpu": {
                **{k: int(round(v)) for k, v in self.states.gpu.items()},
                "model_states": self.states.gpu_total,
                "zero3_working_set": self.zero3_working_set,
                "activations": self.activations,
                "buffers": self.buffers,
                "allocated": self.allocated,
                "overhead": self.overhead,
                "total": self.gpu_total,
            },
            "cpu_per_node": {
                "offloaded_states": self.cpu_offloaded_per_node,
                "model_build": self.cpu_build_per_node,
                "total": self.cpu_per_node,
            },
            "checkpoint_snapshot_per_rank": self.checkpoint_snapshot,
        }


def estimate(
    config: Layout,
    *,
    params: int,
    largest_layer: int,
    gpus: int,
    gpus_per_node: int,
    seq: int | None = None,
    micro_batch: int = 1,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    vocab: int | None = None,
    flash_attention: bool = False,
    fp32_grad_copy: bool = True,
    zero_init: bool = False,
    trainable: int | None = None,
    grad_accum: int | None = None,
) -> Estimate:
    """Per-GPU and per-node memory of ``config`` on ``gpus`` GPUs (``gpus_per_node`` on each node).
    ``trainable``: parameters that train (default: all); the others are frozen (no gradients, no optimizer
    state, no reduction bucket). ``grad_accum``: micro-batches per optimizer step; with 1 the gradients are
    not live at the activations' peak, with more or None (not known) they are."""
    c = config
    if gpus % (c.tp * c.pp):
        raise ValueError(f"tp*pp = {c.tp * c.pp} does not divide {gpus} GPUs")
    dp = gpus // (c.tp * c.pp)
    rank_params = params / (c.tp * c.pp)
    rank_trainable = rank_params if trainable is None else min(trainable, params) / (c.tp * c.pp)
    states = model_states(
        rank_params, stage=c.zero, precision=c.precision, offload=c.offload, dp=dp, fp32_grad_copy=fp32_grad_copy,
        trainable=rank_trainable,
    )
    working = zero3_working_set(largest_layer, stage=c.zero, precision=c.precision, tp=c.tp)
    if seq and layers and hidden and heads:
        acts = activation_memory(
            layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=micro_batch, tp=c.tp,
            precision=c.precision, checkpointing=c.checkpointing, flash_attention=flash_attention, vocab=vocab,
        )
    else:
        acts = None
    buffers = reduce_bucket(rank_trainable, c.precision)
    allocated = peak_allocated(states, working_set=working, activations=acts, buffers=buffers, grad_accum=grad_accum,
                               stage=c.zero)
    over = overhead(allocated, c.zero)
    build_params = largest_layer if (zero_init and c.zero == 3) else params / c.pp
    offloaded, build, cpu_total = cpu_per_node(states, gpus_per_node=gpus_per_node, build_params=build_params)
    return Estimate(
        config=c, dp=dp, states=states, zero3_working_set=working, activations=acts, buffers=buffers,
        allocated=int(allocated), overhead=over, gpu_total=int(allocated + over),
        cpu_offloaded_per_node=offloaded, cpu_build_per_node=build, cpu_per_node=cpu_total,
        checkpoint_snapshot=checkpoint_snapshot(rank_params, stage=c.zero, precision=c.precision, dp=dp,
                                                trainable=rank_trainable),
    )


def transformer_params(layers: int, hidden: int, vocab: int | None = None, seq: int | None = None) -> int:
    """Parameters of a GPT-style transformer: ``12*L*h^2 + 13*L*h`` plus embeddings ``(V + s)*h``."""
    n = 12 * layers * hidden**2 + 13 * layers * hidden
    if vocab:
        n += vocab * hidden
    if seq:
        n += seq * hidden
    return int(n)


def default_heads(hidden: int) -> int:
    """Heads when not given: 128-wide heads (Llama, GPT-3 style), at least 1, dividing ``hidden``."""
    heads = max(1, hidden // 128)
    while hidden % heads:
        heads -= 1
    return heads


def powers_of_two_upto(n: int) -> list[int]:
    return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else [1]
