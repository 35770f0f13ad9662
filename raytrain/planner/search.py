"""Enumerate configurations, estimate each, and pick the fastest that fits.

Candidates: ZeRO 0-3 x offload none/optimizer/all x tp x pp x precision x activation checkpointing, less the
combinations DeepSpeed or raytrain refuse:
  - offload needs ZeRO >= 1; offload ``all`` (parameters) needs ZeRO-3 (raytrain's rules);
  - pipeline parallelism works with ZeRO 0/1 only (DeepSpeed: "ZeRO-2 and ZeRO-3 are incompatible with
    pipeline parallelism");
  - tp is a power of two within one node that divides the GPUs (and the heads, when known);
  - pp is a power of two that divides the remaining GPUs and is at most the number of layers (needs layers).

Fitting: a candidate fits when its GPU total (model states + ZeRO-3 working set + activations + buffers +
overhead) is at most ``gpu_memory * (1 - margin)``, and, when ``cpu_memory`` (per node) is given, its CPU
total per node is at most ``cpu_memory * (1 - margin)``.

Speed ordering: a candidate's ``relative_time`` is the product of rough factors (rules of thumb, not
measurements; they only order the candidates):

    offload       none 1.0, optimizer 1.5, all 3.0        (PCIe transfers, CPU Adam)
    ZeRO stage    0: 1.0, 1: 1.02, 2: 1.05, 3: 1.25        (more collectives per step)
    checkpointing 1.33                                     (one more forward pass)
    tp            1 + 0.1 * log2(tp)                       (all-reduces inside every layer)
    pp            1 + 0.15 * log2(pp)                      (pipeline bubble)
    precision     bf16/fp16 1.0, fp32 2.0                  (no 16-bit tensor cores)

so less offload, a lower ZeRO stage, no checkpointing and fewer tp/pp are faster. Ties go to the smaller
GPU total. The chosen candidate is the first that fits in that order.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from raytrain.errors import ConfigError
from raytrain.planner.memory import (
    OFFLOADS,
    PRECISIONS,
    STAGES,
    Layout,
    Estimate,
    estimate,
    powers_of_two_upto,
)
from raytrain.planner.shape import ModelShape

DEFAULT_MARGIN = 0.10

OFFLOAD_FACTOR = {"none": 1.0, "optimizer": 1.5, "all": 3.0}
ZERO_FACTOR = {0: 1.0, 1: 1.02, 2: 1.05, 3: 1.25}
CHECKPOINTING_FACTOR = 1.33
PRECISION_FACTOR = {"bf16": 1.0, "fp16": 1.0, "fp32": 2.0}


def relative_time(config: Layout) -> float:
    """The speed ordering's cost of ``config`` (1.0 = plain data parallel, no offload, 16-bit)."""
    return (
        OFFLOAD_FACTOR[config.offload]
        * ZERO_FACTOR[config.zero]
        * (CHECKPOINTING_FACTOR if config.checkpointing else 1.0)
        * (1 + 0.1 * math.log2(config.tp))
        * (1 + 0.15 * math.log2(config.pp))
        * PRECISION_FACTOR[config.precision]
    )


@dataclass(frozen=True)
class Hardware:
    gpus: int
    gpu_memory: int  # bytes per GPU
    gpus_per_node: int
    cpu_memory: int | None = None  # bytes per node; None: not checked

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    def to_dict(self) -> dict:
        return {
            "gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
            "gpu_memory": self.gpu_memory, "cpu_memory_per_node": self.cpu_memory,
        }


def make_hardware(gpus: int, gpu_memory: int, gpus_per_node: int | None = None, cpu_memory: int | None = None) -> Hardware:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus {gpus}: must be a whole number >= 1", flag="--gpus")
    if gpus_per_node is None:
        gpus_per_node = min(gpus, 8)
    if gpus_per_node < 1 or gpus % gpus_per_node:
        raise ConfigError(
            f"--gpus-per-node {gpus_per_node}: must be >= 1 and divide --gpus {gpus}", flag="--gpus-per-node"
        )
    return Hardware(gpus=gpus, gpu_memory=gpu_memory, gpus_per_node=gpus_per_node, cpu_memory=cpu_memory)


@dataclass(frozen=True)
class Candidate:
    estimate: Estimate
    relative_time: float
    fits_gpu: bool
    fits_cpu: bool

    @property
    def config(self) -> Layout:
        return self.estimate.config

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_cpu

    def to_dict(self) -> dict:
        return {
            **self.estimate.to_dict(),
            "relative_time": round(self.relative_time, 4),
            "fits": self.fits,
            "fits_gpu": self.fits_gpu,
            "fits_cpu": self.fits_cpu,
        }


@dataclass
class MemoryFit:
    """Every candidate configuration's memory estimate for one model and one set of GPUs, fastest first,
    and the fastest that fits (``chosen``). What `raytrain plan` prints; not a config.plan.Plan (a job)."""

    shape: ModelShape
    hardware: Hardware
    seq: int | None
    micro_batch: int
    margin: float
    flash_attention: bool
    candidates: list[Candidate]  # in speed order
    grad_accum: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate | None:
        return next((c for c in self.candidates if c.fits), None)

    def to_dict(self) -> dict:
        chosen = self.chosen
        return {
            "model": self.shape.to_dict(),
            "workload": {"seq": self.seq, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                         "flash_attention": self.flash_attention},
            "hardware": self.hardware.to_dict(),
            "margin": self.margin,
            "usable_gpu_memory": int(self.hardware.gpu_memory * (1 - self.margin)),
            "chosen": chosen.to_dict() if chosen else None,
            "candidates": [c.to_dict() for c in self.candidates],
            "notes": list(self.notes),
        }


def configurations(
    shape: ModelShape,
    hardware: Hardware,
    *,
    zero: tuple[int, ...] = STAGES,
    offload: tuple[str, ...] = OFFLOADS,
    precision: tuple[str, ...] = ("bf16",),
    tp: tuple[int, ...] | None = None,
    pp: tuple[int, ...] | None = None,
    checkpointing: tuple[bool, ...] = (False, True),
) -> list[Layout]:
    """Every valid configuration within the given choices (``tp``/``pp`` None: all valid sizes)."""
    tps = tp or tuple(
        t for t in powers_of_two_upto(hardware.gpus_per_node)
        if hardware.gpus % t == 0 and (shape.heads is None or shape.heads % t == 0)
    )
    out = []
    for t in tps:
        if hardware.gpus % t:
            continue
        pps = pp or tuple(
            p for p in powers_of_two_upto(hardware.gpus // t)
            if p == 1 or (shape.layers is not None and p <= shape.layers)
        )
        for p, z, o, prec, ck in itertools.product(pps, zero, offload, precision, checkpointing):
            if (hardware.gpus // t) % p:
                continue
            if o != "none" and z == 0 or o == "all" and z != 3:
                continue
            if p > 1 and z > 1:
                continue
            out.append(Layout(zero=z, offload=o, tp=t, pp=p, precision=prec, checkpointing=ck))
    return out


def _no_configuration(hardware: Hardware, choices: dict) -> ConfigError:
    """Name the flag that left no valid configuration."""
    gpus = hardware.gpus
    tps = choices.get("tp") or (1,)
    if choices.get("tp") and all(gpus % t for t in tps):
        return ConfigError(f"--tp {','.join(map(str, tps))}: must divide --gpus {gpus}", flag="--tp")
    pps = choices.get("pp") or (1,)
    if choices.get("pp") and all((gpus // t) % p or gpus % t for t in tps for p in pps):
        return ConfigError(f"--pp {','.join(map(str, pps))}: tp x pp must divide --gpus {gpus}", flag="--pp")
    offloads = choices.get("offload") or OFFLOADS
    stages = choices.get("zero") or STAGES
    flag = "--offload" if choices.get("offload") else "--zero"
    return ConfigError(
        f"--zero {','.join(map(str, stages))} with --offload {','.join(offloads)}"
        + (f" and --pp {','.join(map(str, pps))}" if choices.get("pp") else "")
        + ": no valid combination (offload needs ZeRO >= 1, offload all needs ZeRO-3, pipeline parallelism "
        "needs ZeRO 0 or 1)",
        flag=flag,
    )


def plan(
    shape: ModelShape,
    hardware: Hardware,
    *,
    seq: int | None = None,
    micro_batch: int = 1,
    grad_accum: int | None = None,
    margin: float = DEFAULT_MARGIN,
    flash_attention: bool = False,
    zero_init: bool = False,
    **choices,
) -> MemoryFit:
    """Estimate every configuration (``choices`` restrict them, see :func:`configurations`), fastest first.
    ``grad_accum``: micro-batches per step; None (not known) counts the gradients at the activations' peak."""
    if not 0 <= margin < 1:
        raise ConfigError(f"--margin {margin}: must be in [0, 1), e.g. 0.1 for 10 %", flag="--margin")
    for p in choices.get("precision") or ():
        if p not in PRECISIONS:
            raise ConfigError(f"--precision {p}: use one of {', '.join(PRECISIONS)}", flag="--precision")
    choices = {k: tuple(v) for k, v in choices.items() if v is not None}
    have_activations = bool(seq and shape.layers and shape.hidden and shape.heads)
    if not have_activations and "checkpointing" not in choices:
        choices["checkpointing"] = (False,)  # checkpointing changes nothing the plan can see
    configs = configurations(shape, hardware, **choices)
    if not configs:
        raise _no_configuration(hardware, choices)
    notes = list(shape.notes)
    if not have_activations:
        missing = [f for f, v in (("--seq", seq), ("--layers", shape.layers), ("--hidden", shape.hidden)) if not v]
        notes.append(
            "activations not estimated (need " + ", ".join(missing) + "): the totals count model states, "
            "buffers and overhead only"
        )
    usable_gpu = hardware.gpu_memory * (1 - margin)
    usable_cpu = hardware.cpu_memory * (1 - margin) if hardware.cpu_memory else None
    candidates = []
    for config in configs:
        est = estimate(
            config, params=shape.params, largest_layer=shape.largest_layer, gpus=hardware.gpus,
            gpus_per_node=hardware.gpus_per_node, seq=seq, micro_batch=micro_batch, layers=shape.layers,
            hidden=shape.hidden, heads=shape.heads, vocab=shape.vocab, flash_attention=flash_attention,
            zero_init=zero_init, trainable=shape.trainable, grad_accum=grad_accum,
        )
        candidates.append(
            Candidate(
                estimate=est,
                relative_time=relative_time(config),
                fits_gpu=est.gpu_total <= usable_gpu,
                fits_cpu=usable_cpu is None or est.cpu_per_node <= usable_cpu,
            )
        )
    candidates.sort(
        key=lambda c: (
            round(c.relative_time, 9), c.estimate.gpu_total, c.config.tp * c.config.pp, c.config.zero,
            OFFLOADS.index(c.config.offload), c.config.checkpointing,
        )
    )
    return MemoryFit(
        shape=shape, hardware=hardware, seq=seq, micro_batch=micro_batch, margin=margin,
        flash_attention=flash_attention, candidates=candidates, notes=notes, grad_accum=grad_accum,
    )
