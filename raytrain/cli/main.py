"""The `raytrain` command: a thin layer over raytrain.api and raytrain.targets."""
from __future__ import annotations

import logging

import click

from raytrain import __version__
from raytrain.cli.checkpoints import export, list_checkpoints
from raytrain.cli.cluster import cluster
from raytrain.cli.gpus import gpus
from raytrain.cli.jobs import jobs
from raytrain.cli.plan import plan
from raytrain.cli.submit import submit


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
main.add_command(plan)

if __name__ == "__main__":
    main()
