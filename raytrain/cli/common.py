"""What every command shares: error -> exit code mapping, JSON output."""
from __future__ import annotations

import functools
import json
import math
import sys
from typing import Any, Callable

import click

from raytrain.errors import RaytrainError


class FiniteFloat(click.ParamType):
    """A number option: Click's float, but nan and inf are refused (``--grad-clip nan`` would turn clipping
    off or poison it; a timeout of inf never ends). Every float option of the CLI uses it."""

    name = "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; give a number such as 1.0", param, ctx)
        return number


FINITE_FLOAT = FiniteFloat()


def handle_errors(fn: Callable) -> Callable:
    """Turn raytrain errors into one line on stderr and the contract's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RaytrainError as exc:
            click.echo(f"raytrain: error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


address_option = click.option(
    "--address",
    envvar="RAYTRAIN_ADDRESS",
    default=None,
    help="Ray dashboard/Jobs address (http://HEAD:8265). Default: the local cluster. Env: RAYTRAIN_ADDRESS.",
)


def with_options(*decorators: Callable) -> Callable:
    """Several Click options as one decorator (listed in the order --help shows them)."""

    def apply(fn: Callable) -> Callable:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


# How to reach a Kubernetes API server: `submit`, `cluster` and `jobs` take the same three options.
k8s_connection_options = with_options(
    click.option("--namespace", "-n", "k8s_namespace", metavar="NS",
                 help="Kubernetes namespace (default: the profile's, else the kubeconfig context's)."),
    click.option("--context", "k8s_context", metavar="CTX", help="kubeconfig context (default: the current one)."),
    click.option("--kubeconfig", "k8s_kubeconfig", type=click.Path(), metavar="FILE",
                 help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."),
)


def complete_job_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion for a job id: the runs in the local runs folder, newest first (no cluster call)."""
    from click.shell_completion import CompletionItem

    from raytrain import paths

    try:
        runs = sorted(paths.default_storage().iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    return [CompletionItem(p.name) for p in runs if p.is_dir() and p.name.startswith(incomplete)
            and not p.name.startswith(".")]


def print_table(table: Any, console: Any = None) -> None:
    """A rich Table: boxed on a terminal; in a pipe or a file the same columns aligned with spaces, no box
    lines, never wrapped or cut (rich would fit it to 80 columns and cut ids short), one line per row (a cell's
    lines joined with ","), ``-`` for an empty cell and no space in a heading, so that `| grep` and
    `| awk '{print $3}'` see whole values, each in the same field on every line."""
    from rich.console import Console

    console = console or Console()
    if console.is_terminal:
        console.print(table)
        return
    table.box = None
    table.pad_edge = False
    table.show_edge = False
    table.padding = (0, 1)  # a table drawn with no padding (its box's lines kept the columns apart)
    for column in table.columns:
        column.no_wrap = True  # (the console is wide enough that nothing is cut)
        if isinstance(column.header, str):
            column.header = column.header.replace(" ", "_")
        column._cells = [_one_field(cell) for cell in column._cells]  # (rich keeps a column's cells here)
    wide = Console(width=10_000, no_color=True, highlight=False, color_system=None)
    with wide.capture() as captured:
        wide.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    console.file.flush()


def _one_field(cell: Any) -> Any:
    if not isinstance(cell, str):
        return cell  # (rich renderables other than text: as they are)
    cell = ",".join(line.strip() for line in cell.splitlines() if line.strip())
    return cell or "-"


def output_console() -> Any:
    """rich's Console for a command's text: on a terminal rich wraps lines at its width; in a pipe or a file
    it never wraps (rich would break every line at 80 columns)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console.soft_wrap = True
    return console
