"""`raytrain jobs list|status|logs|stack|stop`."""
from __future__ import annotations

import contextlib
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from raytrain import events, timings
from raytrain.cli.common import (
    address_option, complete_job_id, handle_errors, k8s_connection_options, print_json, print_table, with_options,
)
from raytrain.log_filter import LogFilter, wants_color
from raytrain.cli.progress import ProgressPrinter, describe_metrics, describe_preflight, describe_resize
from raytrain.errors import ClusterError, ConfigError
from raytrain.targets.base import Target
from raytrain.targets.factory import TargetOptions, make_target

# `jobs ... --k8s [--cluster NAME]`: RayJobs, or the jobs of a RayCluster's Jobs API (port-forward).
target_options = with_options(
    click.option("--k8s", "k8s", is_flag=True,
                 help="RayJobs on Kubernetes (or, with --cluster, Ray jobs on that RayCluster via port-forward)."),
    click.option("--cluster", "k8s_cluster", metavar="NAME",
                 help="k8s: jobs submitted to this RayCluster through its Jobs API (port-forward)."),
    k8s_connection_options,
)


def _target(address: str | None, flags: dict) -> Target:
    """The cluster the jobs are on; never starts the local one. With --k8s (which wins over --address):
    RayJobs, or with --cluster that RayCluster's Jobs API."""
    k8s = bool(flags.get("k8s"))
    target = make_target(
        TargetOptions(
            address=None if k8s else address,
            k8s=k8s,
            cluster=flags.get("k8s_cluster"),
            rayjob=k8s and not flags.get("k8s_cluster"),
            namespace=flags.get("k8s_namespace"),
            context=flags.get("k8s_context"),
            kubeconfig=flags.get("k8s_kubeconfig"),
        ),
        auto_start=False,
    )
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # a port-forward's local end is closed when the command ends
        ctx.call_on_close(target.close)
    return target


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def _duration(start: float | None, end: float | None) -> str:
    if not start:
        return ""
    seconds = int((end or time.time()) - start)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@click.group()
def jobs():
    """Jobs raytrain submitted to a cluster."""


@jobs.command("list")
@address_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--last", "last", type=click.IntRange(min=1), metavar="N", help="Only the newest N jobs.")
@target_options
@handle_errors
def list_jobs(address, as_json, last, **k8s):
    """Every raytrain job on the cluster, newest first (--k8s: RayJobs); for the local cluster also the runs
    recorded on this machine that it no longer knows (earlier cluster instances)."""
    from raytrain import api

    infos = api.jobs(_target(address, k8s))[:last]
    if as_json:
        print_json([i.to_dict() for i in infos])
        return
    if not infos:
        click.echo("no raytrain jobs")
        return
    table = Table("id", "name", "state", "workers", "started", "duration")
    for i in infos:
        table.add_row(
            i.job_id, i.name, i.state.value, i.metadata.get("workers", ""), _when(i.start_time),
            _duration(i.start_time, i.end_time),
        )
    print_table(table)


@jobs.command()
@click.argument("job_id", shell_complete=complete_job_id)
@address_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--timings", "show_timings", is_flag=True,
              help="Where the time went from the command's start to step 1, phase by phase.")
@click.option("--storage", metavar="PATH",
              help="The run's storage, where it was not the default (the local cluster's runs folder).")
@target_options
@handle_errors
def status(job_id, address, as_json, show_timings, storage, **k8s):
    """State, last metrics and outcome of one job (from the run's record once its cluster has forgotten it)."""
    from raytrain import api

    info = api.status(job_id, _target(address, k8s), storage)
    rows = timings.timeline(info.facts.timings if info.facts else [], info.start_time) if show_timings else None
    if as_json:
        out = info.to_dict()
        if rows is not None:
            out["timings"] = [r.to_dict() for r in rows]
        print_json(out)
        return
    if rows is not None:
        click.echo(f"{info.job_id}: {info.state.value}")
        for line in timings.table(rows) if rows else ["no timing events in this job's log"]:
            click.echo(line)
        return
    facts = info.facts
    click.echo(f"id        {info.job_id}")
    click.echo(f"name      {info.name}")
    click.echo(f"state     {info.state.value}")
    click.echo(f"started   {_when(info.start_time)}  ({_duration(info.start_time, info.end_time)})")
    if facts and facts.waiting and not info.state.terminal:
        click.echo(f"waiting   {facts.waiting.get('message', '')[len('waiting for '):]}")
    if facts and facts.last_metrics:
        click.echo(f"last      {describe_metrics(facts.last_metrics)}")
    if facts and facts.preflight:
        for i, line in enumerate(describe_preflight(facts.preflight)):
            click.echo(f"{'workers' if i == 0 else '':<9} {line.strip()}")
    if facts and facts.restarts:
        click.echo(f"restarts  {facts.restarts}")
    for event in (facts.preempted if facts else []):
        click.echo(f"preempted {event.get('message', '')[len('preempted: '):]}")
    if facts and facts.checkpoint_events:
        from raytrain.events import checkpoint_timings, describe_checkpoint

        rows = checkpoint_timings(facts)
        more = f" ({len(rows)} committed)" if len(rows) > 1 else ""
        click.echo(f"ckpt      {describe_checkpoint(rows[-1])}{more}")
    if facts:
        from raytrain import goodput

        line = goodput.describe(info.goodput())
        if line:
            click.echo(f"goodput   {line}")
    if facts and facts.resized:
        click.echo(f"resized   {describe_resize(facts.resized[-1])}")
    if facts and facts.skipped:
        more = f" ({len(facts.skipped)} in all)" if len(facts.skipped) > 1 else ""
        click.echo(f"skipped   {facts.skipped[-1].get('message', '')}{more}")
    if facts and facts.rollbacks:
        more = f" ({len(facts.rollbacks)} in all)" if len(facts.rollbacks) > 1 else ""
        click.echo(f"rollback  {facts.rollbacks[-1].get('message', '')}{more}")
    if facts and facts.refused:
        click.echo(f"refused   {facts.refused[-1].get('message', '')}")
    for warning in info.warnings():
        click.echo(f"warning   {warning}")
    if facts and facts.error:
        click.echo(f"error     {facts.error.get('type', '')} {facts.error.get('message', '')}".rstrip())
    elif info.message and info.state.terminal:
        click.echo(f"message   {info.message}")


@jobs.command()
@click.argument("job_id", shell_complete=complete_job_id)
@address_option
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option("--verbose", "-v", is_flag=True,
              help="The log as it is: Ray's own lines too, and raytrain's events as JSON lines.")
@click.option("--rank", "ranks", type=int, multiple=True, metavar="N",
              help="Only rank N's stdout/stderr, from the run's storage (also after the cluster stopped).")
@click.option("--node", metavar="HOST|IP", help="Only the ranks that ran on this node, from the run's storage.")
@click.option("--storage", metavar="PATH", help="--rank/--node: the run's storage where it was not the default (not needed on the machine that submitted it).")
@target_options
@handle_errors
def logs(job_id, address, follow, verbose, ranks, node, storage, **k8s):
    """The job's log (driver and workers), as `submit` showed it: the job's output, a line per step, how it
    ended; -v: the log as it is. --rank/--node: single ranks' output, kept in the run's storage."""
    if ranks or node:
        return _rank_logs(job_id, list(ranks), node, storage, verbose)
    target = _target(address, k8s)
    shown = LogFilter(color=wants_color(sys.stdout.isatty()), verbose=True)
    partial = [""]

    def write(text: str) -> None:  # -v: the log as it is
        lines = (partial[0] + text).split("\n")
        partial[0] = lines.pop()
        out = [kept for kept in map(shown, lines) if kept is not None]
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()

    started = [False]

    def show(feed) -> None:
        printer = None if verbose else ProgressPrinter(Console(), live=False, endings=True)
        with printer or contextlib.nullcontext():  # on leaving: its last line, and how the job ended
            on_text = printer.on_text if printer else write

            def on_text_seen(text: str) -> None:
                started[0] = True
                on_text(text)

            feed(on_text_seen)

    try:
        try:
            show(lambda on_text: target.follow(job_id, on_text) if follow else on_text(target.logs(job_id)))
        except ClusterError as exc:  # a job its cluster no longer knows: its record's events, if it has one
            from raytrain import api, run_record

            folder = None if started[0] else api.record_of(job_id)
            if folder is None:
                raise
            click.echo(f"raytrain: the run's record in {folder} ({exc}): its events; each rank's output: "
                       f"raytrain jobs logs {job_id} --rank N", err=True)
            show(lambda on_text: on_text("".join(line + "\n" for line in run_record.read_lines(folder))))
    except KeyboardInterrupt:
        sys.exit(130)
    if partial[0]:
        write("\n")
    _say_flight_recorder_dumps(job_id)


def _say_flight_recorder_dumps(job_id: str, storage: str | None = None) -> None:
    """The run's NCCL flight-recorder dumps (GPU workers, after a collective timed out), if its record has any."""
    from raytrain import api, flight_recorder

    try:
        found = flight_recorder.dumps(api.record_of(job_id, storage))
    except OSError:
        return
    if found:
        click.echo(f"raytrain: NCCL flight recorder dumps ({len(found)}): " + ", ".join(map(str, found)), err=True)


def _rank_logs(job_id: str, ranks: list[int], node: str | None, storage: str | None, verbose: bool) -> None:
    from raytrain import api, paths, run_record

    folder = api.record_of(job_id, storage)
    found = run_record.rank_logs(folder) if folder is not None else {}
    if not found:
        raise ConfigError(f"{job_id}: no per-rank logs in {storage or paths.default_storage()} (give the run's "
                          "--storage; runs on remote storage keep none)", flag="--rank")
    chosen = {r: p for r, p in found.items() if (not ranks or r in ranks)
              and (node is None or node in run_record.nodes_of(p))}
    if not chosen:
        what = f"rank(s) {', '.join(map(str, ranks))}" if ranks else f"node {node}"
        raise ConfigError(f"{job_id}: no {what}; the run has rank(s) {', '.join(map(str, found))}",
                          flag="--rank" if ranks else "--node")
    for rank, path in chosen.items():
        prefix = f"(rank {rank}) " if len(chosen) > 1 else ""
        shown = LogFilter(color=False, verbose=verbose)  # the fds' copy has Ray's own lines too: as on the terminal
        for line in path.read_text(errors="replace").splitlines():
            if verbose or events.MARKER not in line:
                line = shown(line)
                if line is not None:
                    click.echo(prefix + line)


@jobs.command()
@click.argument("job_id", shell_complete=complete_job_id)
@address_option
@click.option("--wait/--no-wait", default=True, help="Wait until the job has stopped (default).")
@target_options
@handle_errors
def stop(job_id, address, wait, **k8s):
    """Stop a job and free its workers (--k8s: suspend or delete the RayJob)."""
    click.echo(_target(address, k8s).stop_and_wait(job_id, wait=wait))


@jobs.command()
@click.argument("job_id", shell_complete=complete_job_id)
@address_option
@click.option("--json", "as_json", is_flag=True, help="Every rank's threads and frames as JSON.")
@target_options
@handle_errors
def stack(job_id, address, as_json, **k8s):
    """Every rank's Python stack now (all threads), like py-spy dump on every worker at once; a summary line per
    rank first (in a collective or not, where, for how long). Local cluster, --address and --k8s --cluster
    (a short job on the job's cluster); not a RayJob (--k8s alone)."""
    from raytrain import hang

    target = _target(address, k8s)
    if target.kind == "kuberay":
        raise ConfigError(f"jobs stack {job_id} --k8s: a RayJob's cluster runs no other job; use --k8s --cluster "
                          "NAME for jobs on a RayCluster", flag="--k8s")
    event = target.run_utility("raytrain.runtime.driver.hang_watch", events.STACKS, timeout_s=60.0, args=(job_id,))
    if as_json:
        print_json({"job": job_id, "ranks": event.get("ranks") or [], "summary": event.get("summary") or [],
                    **({"message": event["message"]} if event.get("message") else {})})
        return
    if event.get("message"):
        raise ClusterError(event["message"])
    for line in hang.lines(event.get("summary") or []):
        click.echo(line)
    for report in event.get("ranks") or []:
        click.echo("")
        for line in hang.format_stack(report):
            click.echo(line)
    _say_flight_recorder_dumps(job_id)
