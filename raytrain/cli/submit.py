"""`raytrain submit JOB.py [options] [-- JOB_ARGS...]`"""
from __future__ import annotations

import sys

import click
from rich.console import Console

from raytrain import api
from raytrain.cli.common import address_option, handle_errors, k8s_connection_options, print_json, with_options
from raytrain.cli.progress import ProgressPrinter, describe_metrics, memory_summary
from raytrain.config.options import OFFLOADS, PLACEMENTS, PRECISIONS, Options, load_profile
from raytrain.errors import ConfigError
from raytrain.targets.factory import TargetOptions, make_target


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair}: expected KEY=VALUE", flag="--env")
        env[key] = value
    return env


def options_from_flags(job: str, job_args: tuple[str, ...], **flags) -> Options:
    """Flags over the --config profile; unset flags stay None so later layers can fill them."""
    profile = load_profile(flags["config"]) if flags.get("config") else Options()
    given = Options(
        job=job,
        job_args=list(job_args),
        script=flags.get("script"),
        address=flags.get("address"),
        workers=flags.get("workers"),
        gpus_per_worker=flags.get("gpus_per_worker"),
        cpus_per_worker=flags.get("cpus_per_worker"),
        zero=flags.get("zero"),
        offload=flags.get("offload"),
        precision=flags.get("precision"),
        micro_batch=flags.get("micro_batch"),
        grad_accum=flags.get("grad_accum"),
        train_batch=flags.get("train_batch"),
        ds_config=flags.get("ds_config"),
        name=flags.get("name"),
        storage=flags.get("storage"),
        checkpoint_every=flags.get("checkpoint_every"),
        keep=flags.get("keep"),
        max_failures=flags.get("max_failures"),
        resume=flags.get("resume"),
        tp=flags.get("tp"),
        placement=flags.get("placement"),
        interface=flags.get("interface"),
        timeout=flags.get("timeout"),
        pp=flags.get("pp"),
        pp_partition=flags.get("pp_partition"),
        tp_spec=flags.get("tp_spec"),
        activation_checkpointing=flags.get("activation_checkpointing"),
        env=_parse_env(flags.get("env") or ()),
    )
    return given.merged_over(profile)


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
        namespace=flags.get("k8s_namespace"),
        context=flags.get("k8s_context"),
        kubeconfig=flags.get("k8s_kubeconfig"),
    )


def submit_options(fn):
    """The options shared by `submit` (and later `plan`)."""
    for decorator in reversed(
        [
            address_option,
            click.option(
                "--workers", metavar="N|MIN-MAX",
                help="Number of workers (one per GPU), or an elastic range MIN-MAX: start with as many as fit, "
                "continue with fewer (>= MIN) after a lost node, global batch kept. Default 1.",
            ),
            click.option(
                "--gpus-per-worker",
                type=float,
                help="GPUs per worker; 0 = CPU workers on gloo. Default: 1 if the cluster has GPUs, else 0.",
            ),
            click.option("--cpus-per-worker", type=float, help="CPUs reserved per worker. Default 1."),
            click.option("--zero", type=int, help="ZeRO stage 0-3. Default 1."),
            click.option("--offload", type=click.Choice(OFFLOADS), help="ZeRO-Offload to CPU. Default none."),
            click.option("--precision", type=click.Choice(PRECISIONS), help="Default fp32."),
            click.option("--micro-batch", type=int, help="Micro-batch per worker. Default 1."),
            click.option("--grad-accum", type=int, help="Gradient accumulation steps. Default 1."),
            click.option("--train-batch", type=int, help="Global batch; must equal micro x accum x data-parallel."),
            click.option("--ds-config", type=click.Path(), help="DeepSpeed JSON merged under the flags."),
            click.option("--config", type=click.Path(), help="YAML/TOML profile with the same keys; flags win."),
            click.option("--name", help="Job name (default: the job file's name)."),
            click.option("--storage", help="Ray Train storage path or URI for this run's results."),
            click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment for the job (repeatable)."),
            click.option("--checkpoint-every", type=int, help="Checkpoint every N steps (and at the end)."),
            click.option("--keep", type=int, help="Keep only the N latest checkpoints."),
            click.option(
                "--max-failures", type=int,
                help="Restart the workers from the latest checkpoint up to N times (-1: always).",
            ),
            click.option("--resume", metavar="RUN", help="Continue a run (job id/run name) or a checkpoint path."),
            click.option(
                "--placement", type=click.Choice(list(PLACEMENTS)),
                help="How workers are placed on nodes (Ray placement group). Default pack.",
            ),
            click.option(
                "--interface", metavar="IFNAME",
                help="Network interface for gloo/NCCL on every worker (sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME; "
                "checked before training). Default: the interface that reaches rank 0, when all workers agree.",
            ),
            click.option(
                "--timeout", type=float, metavar="SECONDS",
                help="torch.distributed timeout for process-group setup and each collective. Default 600.",
            ),
            click.option("--tp", type=int, help="Tensor-parallel size (DeepSpeed AutoTP). Default 1."),
            click.option("--pp", type=int, help="Pipeline stages (the job calls ctx.pipeline). Default 1."),
            click.option("--pp-partition", help="How layers are split over stages: parameters, uniform, type:REGEX."),
            click.option("--tp-spec", type=click.Path(), help="JSON/YAML AutoTP layer_specs for a plain nn.Module."),
            click.option(
                "--activation-checkpointing/--no-activation-checkpointing", default=None,
                help="Recompute activations in backward (ctx.checkpointed / pipeline layers).",
            ),
            click.option(
                "--script/--no-script", default=None,
                help="Run JOB.py unchanged as __main__ on every worker, as the deepspeed launcher or torchrun "
                "would (script mode). Default: detected (no train(ctx), a __main__ block or module-level code).",
            ),
        ]
    ):
        fn = decorator(fn)
    return fn


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job", type=click.Path(dir_okay=False), required=False)
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
@submit_options
@click.option("--no-wait", is_flag=True, help="Print the job id and return once submitted.")
@click.option("--dry-run", is_flag=True, help="Print the exact request; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="Only the progress line, not the job's log.")
@click.option("--stop-on-interrupt", is_flag=True, help="Ctrl-C stops the job (default: it keeps running).")
@target_options
@handle_errors
def submit(job, job_args, no_wait, dry_run, as_json, quiet, stop_on_interrupt, **flags):
    """Run JOB.py's train(ctx) on Ray workers with DeepSpeed, or (script mode) a deepspeed/torchrun script.

    Arguments after `--` are passed to the job as ctx.args, or to the script as its command line.
    """
    options = options_from_flags(job, job_args, **flags)
    target, request = api.dry_run(options, make_target(target_options_from_flags(options, flags)))
    plan = request.plan
    if plan.mode == "script":
        from raytrain.config.jobfile import check_job_file

        reason = check_job_file(plan.job_file, script=options.script).mode_reason
        click.echo(
            f"raytrain: script mode ({reason}): running {plan.job_module} as __main__ on every worker", err=True
        )
    if dry_run and request.to_text() is not None:  # the target's own format: the exact manifests (YAML)
        if as_json:
            print_json({**request.to_dict(), "deepspeed": plan.deepspeed, "plan": plan.to_dict()})
        else:
            click.echo(request.to_text(), nl=False)
        return
    if dry_run:
        out = {
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
                "micro_batch": plan.deepspeed["train_micro_batch_size_per_gpu"],
                "grad_accum": plan.deepspeed["gradient_accumulation_steps"],
                "data_parallel": plan.parallel["dp"],
                "global_batch": plan.train_batch,
            },
            "mode": plan.mode,
            "plan": plan.to_dict(),
        }
        if as_json:
            print_json(out)
        else:
            click.echo(f"target      {request.target} ({request.address})")
            click.echo(f"job         {plan.job_file} {' '.join(plan.job_args)}")
            click.echo(f"mode        {plan.mode}")
            click.echo(f"entrypoint  {request.entrypoint}")
            click.echo(
                f"scaling     {plan.scaling.workers_label} worker(s) x {plan.scaling.resources_per_worker}"
                f"{' (GPU)' if plan.scaling.use_gpu else ' (CPU, gloo)'}"
            )
            click.echo("deepspeed")
            print_json(plan.deepspeed)
        return

    console = Console(stderr=as_json)
    handle = api.submit_request(target, request)
    if no_wait:
        if as_json:
            print_json({"id": handle.job_id, "name": handle.name, "address": handle.address})
        else:
            console.print(f"submitted {handle.job_id}")
            console.print(f"  follow: raytrain jobs logs {handle.job_id}{_target_flags(target)} --follow")
        return
    console.print(f"raytrain: submitted {handle.job_id} to {handle.address}", highlight=False)
    printer = ProgressPrinter(console, show_logs=not quiet)
    try:
        with printer:
            info = api.wait(handle, target, on_text=printer.on_text)
    except KeyboardInterrupt:
        if stop_on_interrupt:
            target.stop(handle.job_id)
            console.print(f"\nraytrain: stopped {handle.job_id}")
        else:
            where = _target_flags(target)
            console.print(
                f"\nraytrain: {handle.job_id} keeps running.\n"
                f"  follow: raytrain jobs logs {handle.job_id}{where} --follow\n"
                f"  stop:   raytrain jobs stop {handle.job_id}{where}"
            )
        sys.exit(130)
    last = info.facts.last_metrics if info.facts else None
    summary = describe_metrics(last) if last else "no metrics reported"
    console.print(f"raytrain: {handle.job_id} succeeded ({summary})", highlight=False, soft_wrap=True)
    for line in memory_summary(info.facts):
        console.print(f"raytrain: {line}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(info.to_dict())
