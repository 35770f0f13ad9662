"""`raytrain jobs checkpoints RUN` and `raytrain export CKPT --out model.pt` (``--format hf``: a Hugging Face
model folder)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from raytrain import paths
from raytrain.checkpoints import hf_content
from raytrain.checkpoints import store
from raytrain.cli.common import FINITE_FLOAT, complete_job_id, handle_errors, print_json, print_table
from raytrain.errors import ConfigError, RaytrainError

storage_option = click.option(
    "--storage", help="The storage the run used (default: the local cluster's, ~/.raytrain/runs)."
)


def run_dir(run: str, storage: str | None) -> Path:
    path = Path(run).expanduser()
    if path.is_dir():
        return path
    candidate = Path(storage or paths.default_storage()).expanduser() / run
    if candidate.is_dir():
        return candidate
    raise ConfigError(f"no run {run!r} in {candidate.parent} (give --storage, or a path)", flag="RUN")


@click.command("checkpoints")
@click.argument("run", shell_complete=complete_job_id)
@storage_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--all", "show_all", is_flag=True,
              help="Also the uncommitted ones (a save in progress, or one a failure interrupted), with the reason.")
@handle_errors
def list_checkpoints(run, storage, as_json, show_all):
    """Committed checkpoints of RUN (a job id / run name, or a run directory): step, time, size, metrics. A
    checkpoint is committed once every rank's files are complete in storage; only those are resumed from."""
    everything = store.list_checkpoints(run_dir(run, storage))
    found = everything if show_all else [c for c in everything if c.complete]
    hidden = len(everything) - len(found)
    if as_json:
        print_json([c.to_dict() for c in found])
        return
    if hidden:
        click.echo(f"{hidden} uncommitted checkpoint(s) not listed (a save in progress or interrupted): --all "
                   "shows them", err=True)
    if not found:
        click.echo(f"run {run} has no committed checkpoints")
        return
    table = Table("step", "time", "size", "complete", "loss", "path")
    for c in found:
        loss = (c.metrics or {}).get("loss")
        table.add_row(
            str(c.step if c.step is not None else "?"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time)) if c.time else "",
            f"{c.size_bytes / 2**20:.1f} MiB",
            "yes" if c.complete else f"no: {c.reason}",
            f"{loss:.4f}" if isinstance(loss, (int, float)) else "",
            c.path,
        )
    print_table(table)


EXPORT_TIMEOUT_S = 3600.0  # the longest `export` waits for DeepSpeed's consolidation


def run_export(checkpoint: str, out: str, timeout_s: float = EXPORT_TIMEOUT_S, extra: tuple[str, ...] = ()) -> dict:
    """``python -m raytrain.runtime.export.entry`` in its own process (the CLI never imports deepspeed), bounded.
    ``extra``: its options (``--format hf --dtype bf16 ...``)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "raytrain.runtime.export.entry", checkpoint, out, *extra], capture_output=True,
            text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise RaytrainError(
            f"export of {checkpoint} did not finish within {timeout_s:g} s (--timeout); nothing was written to {out}"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RaytrainError(f"export of {checkpoint} failed:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_hf_options(fmt: str, dtype: str | None, merge_adapter: bool, max_shard_size: str | None) -> None:
    """--dtype, --merge-adapter and --max-shard-size shape a Hugging Face folder: only with --format hf."""
    if fmt == "hf":
        return
    for given, flag in ((dtype, "--dtype"), (merge_adapter, "--merge-adapter"), (max_shard_size, "--max-shard-size")):
        if given:
            raise ConfigError(f"{flag}: only with --format hf (the .pt export is an fp32 state_dict)", flag=flag)


SHARD_SIZE_RE = re.compile(r"[1-9][0-9]*(?:[KMG]i?B)", re.IGNORECASE)
# What a --format hf export holds: Hugging Face's model, adapter and tokenizer files, and base/ (a PEFT run's).
EXPORT_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".md", ".jinja", ".tiktoken")


def check_shard_size(max_shard_size: str | None) -> None:
    """--max-shard-size as Hugging Face's save_pretrained reads it: a whole number and a unit."""
    if max_shard_size is not None and not SHARD_SIZE_RE.fullmatch(max_shard_size):
        raise ConfigError(
            f"--max-shard-size {max_shard_size}: use a whole number and a unit, e.g. 500MB, 2GB or 1GiB "
            f"(KB, MB, GB, KiB, MiB, GiB; default {DEFAULT_SHARD_SIZE})", flag="--max-shard-size",
        )


def is_previous_export(folder: Path) -> bool:
    """``folder`` holds nothing but what a --format hf export writes (an empty folder too): the folder
    ``--force`` may replace. Anything else (``--out ~/project``) would be deleted with it."""
    entries = list(folder.iterdir())
    if not entries:
        return True
    names = {e.name for e in entries}
    if not names & {"config.json", "adapter_config.json"}:
        return False
    for entry in entries:
        if entry.is_symlink():
            return False
        if entry.is_dir():
            if entry.name != "base" or not is_previous_export(entry):
                return False
        elif not entry.name.endswith(EXPORT_SUFFIXES):
            return False
    return True


def check_out(out: str, fmt: str, force: bool) -> None:
    """--out: an existing file or folder only with --force, and then only what this export may replace."""
    path = Path(out)
    if not (path.exists() or path.is_symlink()):
        return
    if not force:
        raise ConfigError(f"--out {out}: the file exists; give --force to replace it, or another path", flag="--out")
    if fmt == "pt" and path.is_dir():
        raise ConfigError(f"--out {out}: a folder; the .pt export writes a file (or give --format hf)", flag="--out")
    if fmt == "hf" and (path.is_symlink() or not path.is_dir() or not is_previous_export(path)):
        raise ConfigError(
            f"--out {out}: {'not a folder' if not path.is_dir() or path.is_symlink() else 'a folder with files a Hugging Face export does not write'}; "
            "--force replaces (deletes) only an earlier --format hf export or an empty folder: give a new path",
            flag="--out",
        )


def check_hf_checkpoint(path: str, merge_adapter: bool) -> None:
    """The checkpoint holds a Hugging Face model (a train(ctx) run's description, or a Trainer checkpoint's
    config and weights or adapter), and an adapter for --merge-adapter."""
    refusal = hf_content.hf_refusal(path, merge_adapter)
    if refusal is not None:
        message, flag = refusal
        raise ConfigError(message, flag=flag)


def export_args(fmt: str, dtype: str | None, merge_adapter: bool, max_shard_size: str | None) -> tuple[str, ...]:
    if fmt != "hf":
        return ()
    args = ("--format", "hf", "--dtype", dtype or "fp32", "--max-shard-size", max_shard_size or DEFAULT_SHARD_SIZE)
    return args + (("--merge-adapter",) if merge_adapter else ())


DEFAULT_SHARD_SIZE = "2GB"


def _describe_export(result: dict, out: str, ckpt_path: str) -> str:
    where = f"(step {result['step']} of {ckpt_path})"
    if result.get("format") != "hf":
        return f"wrote {out}: {result['parameters']:,} parameters in {result['tensors']} tensors {where}"
    adapter = {"merged": ", adapter merged", "folder": ", adapter + base/", "adapter": ", the adapter only"}.get(
        result.get("adapter"), "")
    return (f"wrote {out}: {result['architecture']}, {result['parameters']:,} parameters, {result['dtype']}"
            f"{adapter}, {len(result['files'])} files {where}")


@click.command("export")
@click.argument("checkpoint")
@click.option("--out", required=True, type=click.Path(),
              help="Where to write the state_dict (.pt) or the model folder (--format hf).")
@click.option("--format", "fmt", type=click.Choice(["pt", "hf"]), default="pt", show_default=True,
              help="pt: a torch state_dict file; hf: a Hugging Face folder (config.json + safetensors).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), help="--format hf: the weights' dtype (default fp32).")
@click.option("--merge-adapter", is_flag=True, help="--format hf, a LoRA/PEFT run: merge the adapter into the weights.")
@click.option("--max-shard-size", help=f"--format hf: the largest safetensors shard (default {DEFAULT_SHARD_SIZE}).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--timeout", "timeout_s", type=FINITE_FLOAT, default=EXPORT_TIMEOUT_S, show_default=True, metavar="SECONDS",
              help="Give up when the export takes longer.")
@storage_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def export(checkpoint, out, fmt, dtype, merge_adapter, max_shard_size, force, timeout_s, storage, as_json):
    """Write a consolidated fp32 state_dict (loadable without DeepSpeed) from CHECKPOINT, or with --format hf
    a Hugging Face model folder (AutoModelForCausalLM.from_pretrained loads it), for train(ctx) runs and
    Hugging Face Trainer-script runs (a PEFT Trainer run: its adapter, or merged with --merge-adapter).

    CHECKPOINT is a checkpoint directory, or a run (its latest complete checkpoint). The file or folder is
    written whole or not at all (a temporary one renamed into place).
    """
    # every option first (as Click does for types), then the files
    check_hf_options(fmt, dtype, merge_adapter, max_shard_size)
    check_shard_size(max_shard_size)
    check_out(out, fmt, force)
    ckpt = store.resolve_resume(checkpoint, storage or str(paths.default_storage()), flag="CHECKPOINT")
    if fmt == "hf":
        check_hf_checkpoint(ckpt.path, merge_adapter)
    result = run_export(ckpt.path, out, timeout_s, export_args(fmt, dtype, merge_adapter, max_shard_size))
    if as_json:
        print_json(result)
    else:
        click.echo(_describe_export(result, out, ckpt.path))
