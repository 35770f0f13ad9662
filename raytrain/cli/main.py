"""The `raytrain` command: a thin layer over raytrain.api and raytrain.targets."""
from __future__ import annotations

import logging

import click

from raytrain import __version__
from raytrain.cli.checkpoints import export, list_checkpoints
from raytrain.cli.cluster import cluster
from raytrain.cli.gpus import gpus
from raytrain.cli.jobs import jobs
from raytrain.cli.metrics import compare, metrics, plot
from raytrain.cli.memory_plan import plan
from raytrain.cli.submit import submit


class UsageProblem(click.UsageError):
    """Click's own usage errors (unknown option, missing argument, bad choice) in raytrain's one-line style:
    ``raytrain: error: what is wrong; see `raytrain COMMAND --help```, exit 2."""

    def __init__(self, error: click.UsageError):
        super().__init__(error.format_message(), ctx=error.ctx)

    def show(self, file=None) -> None:
        message = " ".join(self.format_message().split()).replace(". (", " (").rstrip(".")
        message = (message[:1].lower() + message[1:]).replace("(Did you mean", "(did you mean")
        click.echo(f"raytrain: error: {message}; see `{command_path(self.ctx)} --help`", file=file, err=file is None)


def command_path(ctx: click.Context | None) -> str:
    """``raytrain jobs stop``, whatever the program was started as (``python -m raytrain.cli.main``)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["raytrain", *reversed(names)])


def _one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, (UsageProblem, click.exceptions.NoArgsIsHelpError)):  # the latter prints the help
        return exc
    return UsageProblem(exc)


class RaytrainGroup(click.Group):
    """The `raytrain` group: usage errors of every subcommand come out as UsageProblem."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line(exc) from None


@click.group(cls=RaytrainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raytrain")
def main():
    """Distributed PyTorch training with DeepSpeed on Ray clusters."""
    from raytrain import timings

    timings.mark("command", timings.process_start_time())  # `jobs status --timings` starts here
    # Ray's client libraries log every upload and websocket close at INFO; raytrain says what matters.
    logging.getLogger("ray").setLevel(logging.WARNING)


main.add_command(submit)
main.add_command(cluster)
main.add_command(jobs)
main.add_command(export)
main.add_command(gpus)
jobs.add_command(list_checkpoints)
for command in (metrics, plot, compare):
    jobs.add_command(command)
main.add_command(plan)

if __name__ == "__main__":
    main()
