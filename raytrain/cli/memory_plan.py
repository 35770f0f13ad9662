"""`raytrain plan`: per-GPU and per-node memory of every DeepSpeed configuration, and the fastest that fits.

    raytrain plan --params 7e9 --layers 32 --hidden 4096 --seq 2048 --micro-batch 4 --gpus 8 --gpu-memory 80GB
    raytrain plan JOB.py --seq 128 --gpus 2 --gpu-memory 24GB -- --layers 4 --dim 256

With a job file the model comes from its ``model(args)`` built on the meta device (see
raytrain.planner.meta); torch is imported only then. The arithmetic is raytrain.planner's.
"""
from __future__ import annotations

import click
from rich import box
from rich.table import Table

from raytrain.cli.common import FINITE_FLOAT, handle_errors, output_console, print_json, print_table
from raytrain.errors import ConfigError
from raytrain.planner import memory, search
from raytrain.planner.shape import check_shape_numbers, shape_from_numbers
from raytrain.planner.units import gb, human_count, parse_count, parse_size

DEFAULT_ROWS_AFTER_CHOSEN = 5
_OFFLOAD_SHORT = {"none": "-", "optimizer": "opt", "all": "all"}


def _choices(values: tuple[str, ...], flag: str, allowed: tuple, convert=str, every: str | None = "all") -> tuple | None:
    """``--zero 2 --zero 3`` or ``--zero 2,3`` -> (2, 3); ``every`` -> every allowed value; none given -> None."""
    if not values:
        return None
    out: list = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip().lower()
            if every and part == every:
                out.extend(allowed)
                continue
            try:
                item = convert(part)
            except ValueError:
                item = None
            if item is None or item not in allowed:
                names = ", ".join(map(str, allowed))
                more = f" (or {every})" if every else ""
                raise ConfigError(f"{flag} {value}: use one or more of {names}{more}", flag=flag)
            out.append(item)
    return tuple(dict.fromkeys(out))


def _power_of_two(text: str) -> int:
    n = int(text)
    if n < 1 or n & (n - 1):
        raise ValueError(text)
    return n


def _sizes(values: tuple[str, ...], flag: str) -> tuple[int, ...] | None:
    if not values:
        return None
    out = []
    for value in values:
        for part in str(value).split(","):
            try:
                out.append(_power_of_two(part.strip()))
            except ValueError:
                raise ConfigError(f"{flag} {value}: expected powers of two such as 1, 2, 4, 8", flag=flag) from None
    return tuple(dict.fromkeys(out))


def _local_gpus() -> list[dict]:
    from raytrain.nvml import gpu_inventory

    return gpu_inventory()


def _model_shape(job, job_args, params, layers, hidden, heads, vocab, largest_layer, seq):
    if job is None:
        if job_args:
            raise ConfigError(
                f"unexpected argument {job_args[0]!r}: give a job file (raytrain plan JOB.py ...) or only flags",
                flag="JOB",
            )
        count = parse_count(params, "--params") if params is not None else None
        return shape_from_numbers(
            count, layers=layers, hidden=hidden, heads=heads, vocab=vocab,
            largest_layer=parse_count(largest_layer, "--largest-layer") if largest_layer is not None else None,
            seq=seq,
        )
    if params is not None:
        raise ConfigError(
            "--params: the job file's model(args) is counted exactly on the meta device; give either the job "
            "file or --params, not both",
            flag="--params",
        )
    from raytrain.planner.meta import inspect_hf_config, inspect_job, is_hf_config  # torch when called

    if is_hf_config(job):
        if job_args:
            raise ConfigError(f"unexpected argument {job_args[0]!r}: a Hugging Face config takes no arguments",
                              flag="JOB")
        shape = inspect_hf_config(job)
    else:
        shape = inspect_job(job, list(job_args))
    check_shape_numbers(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq)
    shape = shape.with_overrides(
        layers=layers, hidden=hidden, heads=heads, vocab=vocab,
        largest_layer=parse_count(largest_layer, "--largest-layer") if largest_layer is not None else None,
    )
    if shape.hidden and shape.heads and shape.hidden % shape.heads:
        if heads is not None:
            raise ConfigError(f"--heads {heads}: must divide the hidden size {shape.hidden}", flag="--heads")
        shape = shape.with_overrides(heads=memory.default_heads(shape.hidden))
    if shape.hidden and not shape.heads:
        shape = shape.with_overrides(heads=memory.default_heads(shape.hidden))
    return shape


def _rows_to_show(p: search.MemoryFit, show_all: bool) -> list[search.Candidate]:
    if show_all:
        return p.candidates
    chosen = p.chosen
    if chosen is None:
        return sorted(p.candidates, key=lambda c: c.estimate.gpu_total)[:10]
    at = p.candidates.index(chosen)
    before = p.candidates[:at]
    if len(before) > 15:  # the faster ones that do not fit: the nearest 15
        before = before[-15:]
    after = [c for c in p.candidates[at + 1:] if c.fits][:DEFAULT_ROWS_AFTER_CHOSEN]
    return before + [chosen] + after


def _gb(nbytes: int | None) -> str:
    """Table cells: one decimal below 100 GB, whole GB above."""
    return gb(nbytes, 0 if nbytes is not None and nbytes >= 99.95e9 else 1)


def _describe(c: search.Candidate) -> str:
    cfg = c.config
    parts = [f"ZeRO-{cfg.zero}", cfg.precision]
    parts.append(f"offload {cfg.offload}" if cfg.offload != "none" else "no offload")
    parts.append("activation checkpointing" if cfg.checkpointing else "no checkpointing")
    if cfg.tp > 1:
        parts.append(f"tp {cfg.tp}")
    if cfg.pp > 1:
        parts.append(f"pp {cfg.pp}")
    return ", ".join(parts)


def _print_table(p: search.MemoryFit, show_all: bool) -> None:
    console = output_console()
    s, hw = p.shape, p.hardware
    dims = [f"{human_count(s.params)} params"]
    for label, value in (("layers", s.layers), ("hidden", s.hidden), ("heads", s.heads), ("vocab", s.vocab)):
        if value:
            dims.append(f"{label} {value}")
    if p.seq:
        dims.append(f"seq {p.seq}")
    dims.append(f"micro-batch {p.micro_batch}")
    if p.grad_accum:
        dims.append(f"grad-accum {p.grad_accum}")
    usable = hw.gpu_memory * (1 - p.margin)
    console.print(
        f"model  {', '.join(dims)}; largest layer {human_count(s.largest_layer)}"
        + (f" ({s.largest_layer_name})" if s.largest_layer_name else ""),
        highlight=False,
    )
    console.print(
        f"GPUs   {hw.gpus} x {gb(hw.gpu_memory)} GB ({hw.gpus_per_node} per node, {hw.nodes} node(s)); "
        f"usable {gb(usable)} GB per GPU with a {p.margin:.0%} margin"
        + (f"; CPU {gb(hw.cpu_memory)} GB per node" if hw.cpu_memory else ""),
        highlight=False,
    )
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), show_edge=False
    )
    for header in ("ZeRO", "off", "tp/pp", "prec", "ckpt", "model", "Z3", "activ", "other", "GPU", "CPU",
                   "time", "fits"):
        table.add_column(
            header, justify="left" if header in ("off", "prec", "ckpt", "fits") else "right", no_wrap=True
        )
    chosen = p.chosen
    for c in _rows_to_show(p, show_all):
        e, cfg = c.estimate, c.config
        fits = "CHOSEN" if c is chosen else "yes" if c.fits else ("CPU!" if c.fits_gpu else "no")
        table.add_row(
            str(cfg.zero), _OFFLOAD_SHORT[cfg.offload], f"{cfg.tp}/{cfg.pp}",
            cfg.precision, "on" if cfg.checkpointing else "off", _gb(e.states.gpu_total), _gb(e.zero3_working_set) if cfg.zero == 3 else "-",
            _gb(e.activations), _gb(e.buffers + e.overhead), _gb(e.gpu_total), _gb(e.cpu_per_node),
            f"{c.relative_time:.2f}", fits,
            style="bold green" if c is chosen else (None if c.fits else "dim"),
        )
    print_table(table, console)
    console.print(
        "GB per GPU unless noted (1 GB = 1e9 B). model: ZeRO model states; Z3: ZeRO-3 layer working set; "
        "other: buffers + overhead; GPU: the step's peak, less than the sum where gradients and activations are "
        "not live at once (--grad-accum 1); CPU: GB per node (x1.5 buffers); time: relative; CPU!: over --cpu-memory",
        style="dim", highlight=False,
    )
    shown = len(_rows_to_show(p, show_all))
    if shown < len(p.candidates):
        console.print(
            f"showing {shown} of {len(p.candidates)} candidates ({sum(c.fits for c in p.candidates)} fit); "
            "--all for every one, --json for scripts",
            highlight=False,
        )
    for note in p.notes:
        console.print(f"note: {note}", highlight=False)
    if chosen:
        console.print(
            f"chosen: {_describe(chosen)}: {gb(chosen.estimate.gpu_total)} GB of {gb(usable)} GB usable per GPU "
            f"(time x{chosen.relative_time:.2f} of the fastest layout)",
            highlight=False,
        )
        console.print(
            f"async checkpoints (--checkpoint-mode async, the default): a snapshot of "
            f"{gb(chosen.estimate.checkpoint_snapshot)} GB of host memory per rank",
            highlight=False,
        )
    else:
        smallest = min(p.candidates, key=lambda c: c.estimate.gpu_total)
        console.print(
            f"nothing fits: the smallest candidate ({_describe(smallest)}) needs {gb(smallest.estimate.gpu_total)} GB "
            f"per GPU, {gb(usable)} GB usable. Lower --micro-batch or --seq, or use more or bigger GPUs",
            highlight=False,
        )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job", type=click.Path(), required=False)
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--params", help="Parameter count: 7e9, 7B, 350M. Not with a job file.")
@click.option("--layers", type=int, help="Transformer layers.")
@click.option("--hidden", type=int, help="Hidden size.")
@click.option("--heads", type=int, help="Attention heads. Default hidden/128.")
@click.option("--vocab", type=int, help="Vocabulary size (adds the logits to activations).")
@click.option("--largest-layer", help="Parameters of the largest module (ZeRO-3 working set). Default: from --hidden.")
@click.option("--seq", type=int, help="Sequence length (needed for activations).")
@click.option("--micro-batch", type=int, default=1, show_default=True, help="Micro-batch per GPU.")
@click.option("--grad-accum", type=int, help="Micro-batches per optimizer step. With 1 the gradients are not live at "
              "the activations' peak; not given: counted there.")
@click.option("--gpus", "--workers", "gpus", type=int, help="GPUs in all (one worker each). Default: local GPUs, or 1.")
@click.option("--gpus-per-node", type=int, help="Default: min(gpus, 8).")
@click.option("--gpu-memory", help="Memory per GPU: 80GB, 80GiB. Default: the local GPU's.")
@click.option("--cpu-memory", help="CPU memory per node, to check offload candidates (e.g. 512GB).")
@click.option("--margin", type=FINITE_FLOAT, default=search.DEFAULT_MARGIN, show_default=True,
              help="Fraction of GPU memory kept free.")
@click.option("--zero", multiple=True, help="Only these ZeRO stages (repeat or 1,2).")
@click.option("--offload", multiple=True, help="Only these offloads: none, optimizer, all (parameters too).")
@click.option("--precision", multiple=True, help="bf16 (default), fp16, fp32, or all.")
@click.option("--tp", multiple=True, help="Only these tensor-parallel sizes.")
@click.option("--pp", multiple=True, help="Only these pipeline-parallel sizes.")
@click.option("--checkpointing/--no-checkpointing", default=None, help="Only with / without activation checkpointing.")
@click.option("--flash-attention", is_flag=True, help="Fused attention: no s*s attention scores stored.")
@click.option("--zero-init", is_flag=True, help="The model is built under deepspeed.zero.Init (ZeRO-3).")
@click.option("--all", "show_all", is_flag=True, help="Show every candidate, not only the ones around the choice.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@handle_errors
def plan(job, job_args, params, layers, hidden, heads, vocab, largest_layer, seq, micro_batch, grad_accum, gpus, gpus_per_node,
         gpu_memory, cpu_memory, margin, zero, offload, precision, tp, pp, checkpointing, flash_attention, zero_init,
         show_all, as_json):
    """Memory per GPU and per node for each DeepSpeed configuration; marks the fastest that fits.

    Give the model as numbers (--params, --layers, --hidden, --seq ...), as JOB.py defining model(args),
    which is built on the meta device (arguments after `--` are passed to it), or as a Hugging Face
    config.json (or model folder), built with AutoModelForCausalLM.from_config on the meta device.
    """
    if micro_batch is not None and micro_batch < 1:
        raise ConfigError(f"--micro-batch {micro_batch}: must be >= 1", flag="--micro-batch")
    if grad_accum is not None and grad_accum < 1:
        raise ConfigError(f"--grad-accum {grad_accum}: must be >= 1 (1: no accumulation)", flag="--grad-accum")
    shape = _model_shape(job, job_args, params, layers, hidden, heads, vocab, largest_layer, seq)
    notes = []
    local = None
    if gpu_memory is None or gpus is None:
        local = _local_gpus()
    if gpu_memory is None:
        if not local:
            raise ConfigError(
                "--gpu-memory: not given and no GPU on this machine; give the memory per GPU, e.g. --gpu-memory 80GB",
                flag="--gpu-memory",
            )
        gpu_bytes = min(int(g["memory_total"]) for g in local if g.get("memory_total"))
        notes.append(f"GPU memory from this machine's {local[0].get('name') or 'GPU'}: {gb(gpu_bytes)} GB")
    else:
        gpu_bytes = parse_size(gpu_memory, "--gpu-memory")
    if gpus is None:
        gpus = len(local) if local else 1
    cpu_bytes = parse_size(cpu_memory, "--cpu-memory") if cpu_memory is not None else None
    hardware = search.make_hardware(gpus, gpu_bytes, gpus_per_node, cpu_bytes)
    result = search.plan(
        shape,
        hardware,
        seq=seq,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        margin=margin,
        flash_attention=flash_attention,
        zero_init=zero_init,
        zero=_choices(zero, "--zero", memory.STAGES, int),
        offload=_choices(offload, "--offload", memory.OFFLOADS, every=None),
        precision=_choices(precision, "--precision", memory.PRECISIONS) or ("bf16",),
        tp=_sizes(tp, "--tp"),
        pp=_sizes(pp, "--pp"),
        checkpointing=None if checkpointing is None else (checkpointing,),
    )
    result.notes[:0] = notes
    if as_json:
        print_json(result.to_dict())
    else:
        _print_table(result, show_all)
