"""`raytrain jobs metrics|plot|compare`: a run's reported steps as a table or a picture. They read the run's
record in its storage (kept after the cluster is down), else the job's log on the cluster."""
from __future__ import annotations

import click

from raytrain import run_record
from raytrain.cli.common import address_option, complete_job_id, handle_errors, print_json
from raytrain.cli.jobs import _target, target_options
from raytrain.errors import ConfigError
from raytrain.run_metrics import RunMetrics, from_lines

storage_option = click.option(
    "--storage", metavar="PATH",
    help="The run's storage, where it was not the default (the local cluster's runs folder).",
)


def load_run(job_id: str, storage: str | None, address: str | None, k8s: dict) -> RunMetrics:
    """The run's metrics: from its record in storage, else from the job's log on a running cluster."""
    from raytrain import api

    folder = api.record_of(job_id, storage)
    if folder is not None:
        return from_lines(job_id, run_record.read_lines(folder))
    target = _target(address, k8s)
    if not target.running():
        raise api.no_record(job_id, storage)
    return from_lines(job_id, target.logs(job_id).splitlines())


def _with_steps(run: RunMetrics) -> RunMetrics:
    if not run.steps:
        raise ConfigError(f"{run.job_id}: no step reported metrics (ctx.report) yet", flag="JOB_ID")
    return run


@click.command("metrics")
@click.argument("job_id", shell_complete=complete_job_id)
@click.option("--json", "as_json", is_flag=True, help="Every step and every rank's memory as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV row per step.")
@storage_option
@address_option
@target_options
@handle_errors
def metrics(job_id, as_json, as_csv, storage, address, **k8s):
    """Every step the job reported, with each rank's peak memory."""
    run = load_run(job_id, storage, address, k8s)
    if as_json:
        print_json(run.to_dict())
        return
    if as_csv:
        click.echo(run.to_csv(), nl=False)
        return
    from raytrain.cli.progress import describe_metrics

    for row in _with_steps(run).steps:
        click.echo(describe_metrics({k: v for k, v in row.items() if not k.startswith("mem_peak_rank")}))
    if run.memory:
        what = "GPU memory" if run.memory_source == "gpu" else "RSS"
        peaks = ", ".join(f"rank {r} {v / 1e9:.2f} GB" for r, v in sorted(run.memory.items()))
        click.echo(f"peak {what}: {peaks}")


@click.command("plot")
@click.argument("job_id", shell_complete=complete_job_id)
@click.option("-o", "--output", required=True, metavar="FILE.png|FILE.svg", help="The picture to write.")
@storage_option
@address_option
@target_options
@handle_errors
def plot(job_id, output, storage, address, **k8s):
    """Loss, throughput and memory per worker (against the planner's estimate) over the steps."""
    from raytrain.cli.plots import check_output, plot_run

    check_output(output)
    click.echo(f"wrote {plot_run(_with_steps(load_run(job_id, storage, address, k8s)), output)}")


@click.command("compare")
@click.argument("job_ids", nargs=-1, required=True, shell_complete=complete_job_id)
@click.option("-o", "--output", required=True, metavar="FILE.png|FILE.svg", help="The picture to write.")
@storage_option
@address_option
@target_options
@handle_errors
def compare(job_ids, output, storage, address, **k8s):
    """Two (or more) runs on the same axes: loss, throughput, memory."""
    from raytrain.cli.plots import check_output, plot_compare

    if len(job_ids) < 2:
        raise ConfigError("compare: give two or more job ids", flag="JOB_IDS")
    check_output(output)
    runs = [_with_steps(load_run(j, storage, address, k8s)) for j in job_ids]
    click.echo(f"wrote {plot_compare(runs, output)}")
