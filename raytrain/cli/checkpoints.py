"""`raytrain jobs checkpoints RUN` and `raytrain export CKPT --out model.pt`."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from raytrain import paths
from raytrain.checkpoints import store
from raytrain.cli.common import complete_job_id, handle_errors, print_json
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
@handle_errors
def list_checkpoints(run, storage, as_json):
    """Checkpoints of RUN (a job id / run name, or a run directory): step, time, size, metrics."""
    found = store.list_checkpoints(run_dir(run, storage))
    if as_json:
        print_json([c.to_dict() for c in found])
        return
    if not found:
        click.echo(f"run {run} has no checkpoints")
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
    Console().print(table)


EXPORT_TIMEOUT_S = 3600.0  # the longest `export` waits for DeepSpeed's consolidation


def run_export(checkpoint: str, out: str, timeout_s: float = EXPORT_TIMEOUT_S) -> dict:
    """``python -m raytrain.runtime.export`` in its own process (the CLI never imports deepspeed), bounded."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "raytrain.runtime.export", checkpoint, out], capture_output=True, text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise RaytrainError(
            f"export of {checkpoint} did not finish within {timeout_s:g} s (--timeout); nothing was written to {out}"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RaytrainError(f"export of {checkpoint} failed:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@click.command("export")
@click.argument("checkpoint")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the state_dict.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--timeout", "timeout_s", type=float, default=EXPORT_TIMEOUT_S, show_default=True, metavar="SECONDS",
              help="Give up when the export takes longer.")
@storage_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def export(checkpoint, out, force, timeout_s, storage, as_json):
    """Write a consolidated fp32 state_dict (loadable without DeepSpeed) from CHECKPOINT.

    CHECKPOINT is a checkpoint directory, or a run (its latest complete checkpoint). The file is written
    whole or not at all (a temporary file renamed into place).
    """
    if Path(out).exists() and not force:
        raise ConfigError(f"--out {out}: the file exists; give --force to replace it, or another path", flag="--out")
    ckpt = store.resolve_resume(checkpoint, storage or str(paths.default_storage()), flag="CHECKPOINT")
    result = run_export(ckpt.path, out, timeout_s)
    if as_json:
        print_json(result)
    else:
        click.echo(
            f"wrote {out}: {result['parameters']:,} parameters in {result['tensors']} tensors "
            f"(step {result['step']} of {ckpt.path})"
        )
