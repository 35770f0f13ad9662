"""`raytrain submit JOB.py [options] [-- JOB_ARGS...]`"""
from __future__ import annotations

import sys

import click
from rich.console import Console

from raytrain import api
from raytrain.cli.common import handle_errors, k8s_connection_options, print_json, with_options
from raytrain.cli.options import options_from_flags, submit_options
from raytrain.cli.progress import ProgressPrinter, describe_metrics, memory_summary
from raytrain.config.options import Options
from raytrain.targets.factory import TargetOptions, make_target
from raytrain.errors import ClusterError


def _target_flags(target) -> str:
    """The flags that point `raytrain jobs ...` at the same cluster as this submit."""
    return "".join(f" {flag}" for flag in target.reconnect_flags())


# Where the plan is submitted (with --address, which submit_options declares): `submit --k8s [--cluster NAME]
# [--rayjob] ...`. The library's target factory checks the combinations.
target_options = with_options(
    click.option("--k8s", "k8s", is_flag=True,
                 help="Submit to KubeRay: through a port-forward to --cluster's head, or as a RayJob (--rayjob)."),
    click.option("--cluster", "k8s_cluster", metavar="NAME",
                 help="k8s: the RayCluster to run on (default without --rayjob: the profile's name, 'raytrain')."),
    click.option("--rayjob", "k8s_rayjob", is_flag=True,
                 help="k8s: create a RayJob (its own cluster, or --cluster's) for code in the image or at a URI."),
    click.option("--profile", "k8s_profile", type=click.Path(), metavar="FILE",
                 help="k8s: cluster profile (cluster/k8s-example.yaml) for the RayJob's cluster and defaults."),
    click.option("--working-dir", "k8s_working_dir", metavar="URI|PATH",
                 help="k8s --rayjob: the job's folder as the cluster sees it (s3://..., https://....zip, /app)."),
    click.option("--submission-id", "k8s_submission_id", metavar="ID",
                 help="k8s --rayjob: the RayJob name; submitting the same id again never starts a second job."),
    click.option("--env-from-secret", "k8s_env_from_secret", metavar="NAME=SECRET/KEY", multiple=True,
                 help="k8s: set NAME on every Ray pod from key KEY of Kubernetes Secret SECRET (secretKeyRef; the "
                      "value is in no manifest). A --rayjob's own cluster gets it; an existing --cluster must "
                      "already have it (its profile's env-from-secret). Repeatable."),
    k8s_connection_options,
)


def target_options_from_flags(options: Options, flags: dict) -> TargetOptions:
    """--k8s and its options; the address is the submit's (flag, $RAYTRAIN_ADDRESS, else --config's)."""
    return TargetOptions(
        # with --k8s only an --address flag (or $RAYTRAIN_ADDRESS) conflicts; a --config profile's is ignored
        address=flags.get("address") if flags.get("k8s") else options.address,
        k8s=bool(flags.get("k8s")),
        cluster=flags.get("k8s_cluster"),
        rayjob=bool(flags.get("k8s_rayjob")),
        profile=flags.get("k8s_profile"),
        working_dir=flags.get("k8s_working_dir"),
        submission_id=flags.get("k8s_submission_id"),
        env_from_secret=tuple(flags.get("k8s_env_from_secret") or ()),
        namespace=flags.get("k8s_namespace"),
        context=flags.get("k8s_context"),
        kubeconfig=flags.get("k8s_kubeconfig"),
    )


def data_summary(plan) -> dict | None:
    """What runs where for --data (raytrain.config.data.data_plan), or None without --data."""
    if not plan.data:
        return None
    from raytrain.config.data import data_plan, defines_preprocess

    return data_plan(
        plan.data, preprocess=defines_preprocess(plan.job_file), prefetch=plan.prefetch, dp=plan.parallel["dp"],
        micro=plan.micro_batch, mode=plan.mode,
    )


def describe_data(plan) -> list[str]:
    """--dry-run's lines about the datasets: what is read, how, and where preprocessing runs."""
    summary = data_summary(plan)
    if summary is None:
        return []
    from raytrain.config.data import describe, describe_share

    lines = [f"data        {line}" for line in describe(plan.data)]
    for key in ("preprocess_where", "streaming", "workers"):
        lines.append(f"            {key.split('_')[0]}: {summary[key]}")
    for spec, read in zip(plan.data, summary["read_per_rank"]):
        lines.append(f"            per rank: {describe_share(spec['name'], read)}")
    return lines


def _versions(target, request) -> dict:
    """The Ray, Python, torch and DeepSpeed the job will run against, per component {this_machine, cluster,
    needed}: this machine's on the local cluster; on an --address cluster what its dashboard and a tiny probe
    job report (bounded; None where the cluster did not answer: checked again at submit)."""
    from raytrain import compat

    local = compat.local_versions()
    cluster: dict = {}
    if request.target == "local":
        cluster = dict(local)
    elif request.target == "address":
        try:
            cluster["ray"] = str(target.dashboard.check_reachable().get("ray_version") or "") or None
            found, _why = target.cluster_versions()
            cluster.update({k: v for k, v in (found or {}).items() if k != "ray"})
        except ClusterError:
            pass
    return {c: {"this_machine": local.get(c), "cluster": cluster.get(c), "needed": compat.supported(c),
                "known": c in cluster} for c in compat.NEEDS}


def _dry_run_summary(request, plan, versions: dict) -> dict:
    """What `submit --dry-run --json` prints for a Ray Jobs API request."""
    return {
        **request.to_dict(),
        "deepspeed": plan.deepspeed,
        "scaling": {
            "workers": plan.scaling.workers_label if plan.scaling.elastic else plan.scaling.num_workers,
            "num_workers": plan.scaling.num_workers,
            **({"min_workers": plan.scaling.min_workers} if plan.scaling.elastic else {}),
            "use_gpu": plan.scaling.use_gpu,
            "resources_per_worker": plan.scaling.resources_per_worker,
            "placement_strategy": plan.scaling.placement_strategy,
        },
        "parallel": plan.parallel,
        "batch": {
            "micro_batch": plan.micro_batch,
            "grad_accum": plan.grad_accum,
            "data_parallel": plan.parallel["dp"],
            "global_batch": plan.train_batch,
        },
        "ray": {k: v for k, v in versions["ray"].items() if k != "known"},
        "versions": versions,
        "mode": plan.mode,
        "data": data_summary(plan),
        "plan": plan.to_dict(),
    }


def _print_dry_run(request, as_json: bool, versions: dict) -> None:
    """The exact request: in the target's own format (Kubernetes manifests) where it has one. Shown, not
    sent: the values of --env are masked (secrets on a shared screen or in CI logs)."""
    from raytrain import redact
    from raytrain.config.plan import Plan

    request = request.masked()
    plan = Plan.from_dict(redact.plan_dict(request.plan.to_dict()))
    if request.to_text() is not None:
        if as_json:
            print_json({**request.to_dict(), "deepspeed": plan.deepspeed, "plan": plan.to_dict()})
        else:
            click.echo(request.to_text(), nl=False)
        return
    if as_json:
        print_json(_dry_run_summary(request, plan, versions))
        return
    click.echo(f"target      {request.target} ({request.address})")
    click.echo(f"job         {plan.job_file} {' '.join(plan.job_args)}")
    click.echo(f"mode        {plan.mode}")
    for component, v in versions.items():
        runs_on = v["cluster"] if v["known"] else "the cluster's, checked at submit"
        runs_on = runs_on or "not installed"
        click.echo(f"{component:<12}{runs_on}; raytrain needs {v['needed']}; this machine has {v['this_machine']}")
    click.echo(f"entrypoint  {request.entrypoint}")
    if request.upload:
        u = request.upload
        if u.get("copied_to"):  # the local cluster reads this file system: a copy, no upload
            click.echo(f"job code    {u['folder']}: {u['files']} files, {u['size']}, copied to {u['copied_to']}")
        else:
            click.echo(f"upload      {u['folder']}: {u['files']} files, {u['size']}")
    click.echo(
        f"scaling     {plan.scaling.workers_label} worker(s) x {plan.scaling.resources_per_worker}"
        f"{' (GPU)' if plan.scaling.use_gpu else ' (CPU, gloo)'}"
    )
    for line in describe_data(plan):
        click.echo(line)
    click.echo("deepspeed")
    print_json(plan.deepspeed)


def _say_script_mode(options: Options, plan) -> None:
    if plan.mode == "script":
        from raytrain.config.job_check import check_job_file

        reason = check_job_file(plan.job_file, script=options.script).mode_reason
        click.echo(
            f"raytrain: script mode ({reason}): running {plan.job_module} as __main__ on every worker", err=True
        )
        if plan.hf_trainer:
            given = " ".join(f"{k} {v}" for k, v in plan.script_defaults.items())
            click.echo(
                "raytrain: a Hugging Face Trainer script: the DeepSpeed config leaves batch sizes, accumulation, "
                f"clipping and precision to its TrainingArguments (\"auto\"), and gives the script what it does "
                f"not give itself: {given}",
                err=True,
            )


def _follow(console: Console, target, handle, *, quiet: bool, verbose: bool, stop_on_interrupt: bool,
            storage: str | None = None):
    """Follow the job to its end (its log unless ``quiet``; Ray's own lines too with ``verbose``); Ctrl-C leaves
    it running unless asked to stop."""
    printer = ProgressPrinter(console, show_logs=not quiet, verbose=verbose)
    try:
        with printer:
            return api.wait(handle, target, on_text=printer.on_text, storage=storage, shown=printer.shown)
    except KeyboardInterrupt:
        where = _target_flags(target)
        if stop_on_interrupt:
            try:
                target.stop(handle.job_id)
            except ClusterError as exc:
                console.print(f"\nraytrain: could not stop {handle.job_id}: {exc}\n"
                              f"  stop:   raytrain jobs stop {handle.job_id}{where}")
                sys.exit(130)
            console.print(f"\nraytrain: stopped {handle.job_id}")
        else:
            console.print(
                f"\nraytrain: {handle.job_id} keeps running.\n"
                f"  follow: raytrain jobs logs {handle.job_id}{where} --follow\n"
                f"  stop:   raytrain jobs stop {handle.job_id}{where}"
            )
        sys.exit(130)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job", type=click.Path(dir_okay=False), required=False)
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
@submit_options
@click.option("--no-wait", is_flag=True, help="Print the job id and return once submitted.")
@click.option("--dry-run", is_flag=True, help="Print the exact request; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="Only the progress line, not the job's log.")
@click.option("--verbose", "-v", is_flag=True, help="Everything the job's log holds, Ray's own lines included.")
@click.option("--stop-on-interrupt", is_flag=True, help="Ctrl-C stops the job (default: it keeps running).")
@target_options
@handle_errors
def submit(job, job_args, no_wait, dry_run, as_json, quiet, verbose, stop_on_interrupt, **flags):
    """Run JOB.py's train(ctx) on Ray workers with DeepSpeed, or (script mode) a deepspeed/torchrun script.

    Arguments after `--` are passed to the job as ctx.args, or to the script as its command line.
    """
    options = options_from_flags(job, job_args, **flags)
    target = make_target(target_options_from_flags(options, flags))
    # A port-forward's local end is open only while this command needs it, whichever way it ends.
    click.get_current_context().call_on_close(target.close)
    target, request = api.dry_run(options, target)
    _say_script_mode(options, request.plan)
    if dry_run:
        _print_dry_run(request, as_json, _versions(target, request))
        return

    console = Console(stderr=as_json)
    if verbose:  # the driver keeps Ray's INFO lines too
        request.runtime_env.setdefault("env_vars", {})["RAYTRAIN_VERBOSE"] = "1"
    if not target.running():  # the local cluster, on first use: say what the wait is
        console.print("raytrain: starting the local Ray cluster (it stays up for the next job; "
                      "`raytrain cluster down` stops it)", highlight=False, soft_wrap=True)
    handle = api.submit_request(target, request)
    if no_wait:
        if as_json:
            print_json({"id": handle.job_id, "name": handle.name, "address": handle.address})
        else:
            console.print(f"submitted {handle.job_id}")
            console.print(f"  follow: raytrain jobs logs {handle.job_id}{_target_flags(target)} --follow")
        return
    console.print(f"raytrain: submitted {handle.job_id} to {handle.address}", highlight=False, soft_wrap=True)
    info = _follow(console, target, handle, quiet=quiet, verbose=verbose, stop_on_interrupt=stop_on_interrupt,
                   storage=request.plan.storage)
    last = info.facts.last_metrics if info.facts else None
    summary = describe_metrics(last) if last else "no metrics reported"
    console.print(f"raytrain: {handle.job_id} succeeded ({summary})", highlight=False, soft_wrap=True)
    for line in memory_summary(info.facts):
        console.print(f"raytrain: {line}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(info.to_dict())
