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


@click.command("export")
@click.argument("checkpoint")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where to write the state_dict.")
@storage_option
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def export(checkpoint, out, storage, as_json):
    """Write a consolidated fp32 state_dict (loadable without DeepSpeed) from CHECKPOINT.

    CHECKPOINT is a checkpoint directory, or a run (its latest complete checkpoint).
    """
    ckpt = store.resolve_resume(checkpoint, storage or str(paths.default_storage()), flag="CHECKPOINT")
    proc = subprocess.run(
        [sys.executable, "-m", "raytrain.runtime.export", ckpt.path, out], capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RaytrainError(f"export of {ckpt.path} failed:\n{tail}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if as_json:
        print_json(result)
    else:
        click.echo(
            f"wrote {out}: {result['parameters']:,} parameters in {result['tensors']} tensors "
            f"(step {result['step']} of {ckpt.path})"
        )
