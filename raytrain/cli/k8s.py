"""``--k8s`` for `submit`, `cluster` and `jobs`: option decorators and handlers (KubeRay on Kubernetes).

Nothing here imports the kubernetes client at import time: it is loaded only once a command runs with
``--k8s`` (or a ``kind: kuberay`` profile).
"""
from __future__ import annotations

import time
from typing import Any

import click

from raytrain.errors import ConfigError

_CONNECTION = [
    click.option("--namespace", "-n", "k8s_namespace", metavar="NS",
                 help="Kubernetes namespace (default: the profile's, else the kubeconfig context's)."),
    click.option("--context", "k8s_context", metavar="CTX", help="kubeconfig context (default: the current one)."),
    click.option("--kubeconfig", "k8s_kubeconfig", type=click.Path(), metavar="FILE",
                 help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."),
]


def _apply(fn, decorators):
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def submit_options(fn):
    """`submit --k8s [--cluster NAME] [--rayjob] ...`"""
    return _apply(fn, [
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
        *_CONNECTION,
    ])


def cluster_options(fn):
    """`cluster up|status|down --k8s [--profile FILE] [--name N] [--namespace NS]`"""
    return _apply(fn, [
        click.option("--k8s", "k8s", is_flag=True, help="A KubeRay RayCluster instead of the local cluster."),
        click.option("--profile", "k8s_profile", type=click.Path(), metavar="FILE",
                     help="Cluster profile (cluster/local.yaml, cluster/k8s-example.yaml)."),
        click.option("--name", "k8s_name", metavar="N", help="k8s: RayCluster name (default: the profile's, 'raytrain')."),
        *_CONNECTION,
    ])


def jobs_options(fn):
    """`jobs list|status|logs|stop --k8s [--cluster NAME]`"""
    return _apply(fn, [
        click.option("--k8s", "k8s", is_flag=True,
                     help="RayJobs on Kubernetes (or, with --cluster, Ray jobs on that RayCluster via port-forward)."),
        click.option("--cluster", "k8s_cluster", metavar="NAME",
                     help="k8s: jobs submitted to this RayCluster through its Jobs API (port-forward)."),
        *_CONNECTION,
    ])


# -- shared --------------------------------------------------------------------------------------------
_K8S_ONLY = {
    "k8s_cluster": "--cluster",
    "k8s_rayjob": "--rayjob",
    "k8s_working_dir": "--working-dir",
    "k8s_submission_id": "--submission-id",
    "k8s_namespace": "--namespace",
    "k8s_context": "--context",
    "k8s_kubeconfig": "--kubeconfig",
    "k8s_name": "--name",
}


def _profile(flags: dict[str, Any]):
    from raytrain.clusters.profiles import K8sProfile, default_k8s_profile, load_cluster_profile

    path = flags.get("k8s_profile")
    if not path:
        return default_k8s_profile()
    profile = load_cluster_profile(path)
    if not isinstance(profile, K8sProfile):
        raise ConfigError(f"--profile {path}: a `kind: local` profile cannot be used with --k8s", flag="--profile")
    return profile


def _connection(flags: dict[str, Any]):
    from raytrain.clusters.k8s_client import KubeConnection

    return KubeConnection(flags.get("k8s_kubeconfig"), flags.get("k8s_context"))


def _refuse_without_k8s(flags: dict[str, Any], allowed: tuple[str, ...] = ()) -> None:
    for key, flag in _K8S_ONLY.items():
        if key not in allowed and flags.get(key):
            raise ConfigError(f"{flag} is a Kubernetes option: add --k8s", flag=flag)


def enabled(flags: dict[str, Any]) -> bool:
    """--k8s given; a Kubernetes-only option without it is refused."""
    if not flags.get("k8s"):
        _refuse_without_k8s(flags)
        return False
    return True


# -- submit --------------------------------------------------------------------------------------------
def submit_target(flags: dict[str, Any]):
    """The k8s target the flags ask for, or None without --k8s."""
    if not flags.get("k8s"):
        _refuse_without_k8s(flags)
        if flags.get("k8s_profile"):
            raise ConfigError("--profile is a Kubernetes option for submit: add --k8s", flag="--profile")
        return None
    if flags.get("address"):
        raise ConfigError("--address and --k8s: give one (unset RAYTRAIN_ADDRESS to use --k8s)", flag="--address")
    profile = _profile(flags)
    conn = _connection(flags)
    if flags.get("k8s_rayjob"):
        from raytrain.targets.kuberay import RayJobTarget

        return RayJobTarget(
            conn,
            profile=profile,
            namespace=flags.get("k8s_namespace"),
            ray_cluster=flags.get("k8s_cluster"),
            working_dir=flags.get("k8s_working_dir"),
            submission_id=flags.get("k8s_submission_id"),
        )
    for key in ("k8s_working_dir", "k8s_submission_id"):
        if flags.get(key):
            raise ConfigError(
                f"{_K8S_ONLY[key]} is for --rayjob; without it raytrain uploads the job's folder through a "
                "port-forward and picks the submission id", flag=_K8S_ONLY[key],
            )
    from raytrain.targets.k8s_portforward import RayClusterJobsTarget

    return RayClusterJobsTarget(
        conn,
        ray_cluster=flags.get("k8s_cluster") or profile.name,
        namespace=flags.get("k8s_namespace"),
        default_namespace=profile.namespace,
    )


def dry_run_document(request) -> dict[str, Any] | None:
    """For the port-forward path (no manifest is applied): what would be done, as one YAML document."""
    if not getattr(request, "port_forward", None):
        return None
    pf = request.port_forward
    return {
        "portForward": {**pf, "kubectl": f"kubectl port-forward -n {pf['namespace']} svc/{pf['service']} :{pf['remote_port']}"},
        "jobSubmission": {
            "address": request.address,
            "submission_id": request.submission_id,
            "entrypoint": request.entrypoint,
            "entrypoint_num_cpus": request.entrypoint_num_cpus,
            "metadata": request.metadata,
            "runtime_env": request.runtime_env,
        },
    }


def print_dry_run(request, as_json: bool) -> None:
    """The exact manifests (YAML) a k8s submit would apply; with --json, the whole request."""
    from raytrain.cli.common import print_json
    from raytrain.clusters.k8s_manifests import to_yaml

    plan = request.plan
    if as_json:
        print_json({**request.to_dict(), "deepspeed": plan.deepspeed, "plan": plan.to_dict()})
        return
    doc = dry_run_document(request)
    if doc is not None:
        click.echo("# Nothing is applied to the cluster: raytrain port-forwards to the head Service and")
        click.echo("# submits through the Ray Jobs API, uploading the job's folder as working_dir.")
        click.echo(to_yaml([doc]), nl=False)
    else:
        click.echo(to_yaml(request.manifests), nl=False)


# -- cluster -------------------------------------------------------------------------------------------
def wants_k8s(flags: dict[str, Any]) -> bool:
    """--k8s, or a `kind: kuberay` profile."""
    if flags.get("k8s"):
        return True
    path = flags.get("k8s_profile")
    if path:
        from raytrain.clusters.profiles import K8sProfile, load_cluster_profile

        if isinstance(load_cluster_profile(path), K8sProfile):
            return True
    _refuse_without_k8s(flags)
    return False


def refuse_local_flags(**values: Any) -> None:
    for key, value in values.items():
        if value is not None:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is for the local cluster; a RayCluster's size comes from --profile", flag=flag)


def local_up_args(flags: dict[str, Any], num_cpus, num_gpus, port, dashboard_port) -> dict[str, Any]:
    """`cluster up` flags over a `kind: local` profile over the defaults."""
    from raytrain.clusters import local_head
    from raytrain.clusters.profiles import LocalProfile, load_cluster_profile

    profile = load_cluster_profile(flags["k8s_profile"]) if flags.get("k8s_profile") else LocalProfile()
    return {
        "num_cpus": num_cpus if num_cpus is not None else profile.num_cpus,
        "num_gpus": num_gpus if num_gpus is not None else profile.num_gpus,
        "port": port or profile.port or local_head.DEFAULT_PORT,
        "dashboard_port": dashboard_port or profile.dashboard_port or local_head.DEFAULT_DASHBOARD_PORT,
    }


def _clusters(flags: dict[str, Any]):
    from raytrain.clusters.raycluster import RayClusters

    profile = _profile(flags)
    conn = _connection(flags)
    namespace = conn.namespace(flags.get("k8s_namespace"), profile.namespace)
    return profile, RayClusters(conn, namespace), flags.get("k8s_name") or profile.name


def cluster_up(flags: dict[str, Any], *, dry_run: bool = False) -> None:
    from raytrain.clusters.k8s_manifests import to_yaml

    profile, clusters, name = _clusters(flags)
    manifest = clusters.render(profile, name)
    if dry_run:
        click.echo(to_yaml([manifest]), nl=False)
        return
    result = clusters.apply(manifest)
    w = profile.workers
    gpu = f", {w.gpu} GPU" if w.gpu else ""
    click.echo(
        f"RayCluster {clusters.namespace}/{name} {result.action}: head {profile.head.cpu} CPU; "
        f"{w.replicas} x {w.group_name} ({w.cpu} CPU{gpu}, {w.memory})"
    )
    ns = f" --namespace {clusters.namespace}"
    click.echo(f"  status: raytrain cluster status --k8s --name {name}{ns}")
    click.echo(f"  submit: raytrain submit JOB.py --k8s --cluster {name}{ns}")


def cluster_status(flags: dict[str, Any], as_json: bool) -> None:
    from raytrain.cli.common import print_json

    _, clusters, name = _clusters(flags)
    report = clusters.report(name)
    if as_json:
        print_json(report)
        return
    if not report["exists"]:
        click.echo(f"no RayCluster {name!r} in namespace {clusters.namespace} (create it: raytrain cluster up --k8s)")
        return
    workers = report["available_workers"]
    desired = report["desired_workers"]
    click.echo(f"RayCluster {report['namespace']}/{report['name']}: {report['state']}"
               + (f" ({report['reason']})" if report["reason"] else ""))
    if desired is not None or workers is not None:
        click.echo(f"  workers   {workers if workers is not None else '?'}/{desired if desired is not None else '?'} available")
    for g in report["worker_groups"]:
        limits = ", ".join(f"{k} {v}" for k, v in g["limits"].items())
        click.echo(f"  group     {g['name']}: {g['replicas']} x ({limits})")
    click.echo(f"  capacity  {report['totals']['cpus']:g} CPU, {report['totals']['gpus']:g} GPU (Ray's view at full size)")
    click.echo(f"  head      svc/{report['head_service']} (ClusterIP), dashboard port {report['dashboard_port']}")
    if report["storage"]:
        click.echo(f"  storage   {report['storage']}")


def cluster_down(flags: dict[str, Any]) -> None:
    _, clusters, name = _clusters(flags)
    if clusters.delete(name):
        click.echo(f"RayCluster {clusters.namespace}/{name} deleted (KubeRay removes its pods)")
    else:
        click.echo(f"no RayCluster {name!r} in namespace {clusters.namespace}")


# -- jobs ----------------------------------------------------------------------------------------------
def jobs_target(flags: dict[str, Any]):
    """RayJobs (or, with --cluster, the RayCluster's Jobs API through a port-forward); None without --k8s."""
    if not flags.get("k8s"):
        _refuse_without_k8s(flags)
        return None
    from raytrain.clusters.profiles import default_k8s_profile

    conn = _connection(flags)
    if flags.get("k8s_cluster"):
        from raytrain.targets.k8s_portforward import RayClusterJobsTarget

        return RayClusterJobsTarget(conn, ray_cluster=flags["k8s_cluster"], namespace=flags.get("k8s_namespace"))
    from raytrain.targets.kuberay import RayJobTarget

    return RayJobTarget(conn, profile=default_k8s_profile(), namespace=flags.get("k8s_namespace"))


def stop_job(flags: dict[str, Any], job_id: str, wait: bool) -> None:
    from raytrain.targets.kuberay import RayJobTarget

    target = jobs_target(flags)
    if not isinstance(target, RayJobTarget):
        stopped = target.stop(job_id)
        info = target.status(job_id, with_facts=False)
    else:
        before = target.status(job_id, with_facts=False)
        if not target.stop(job_id):
            click.echo(f"{job_id}: {before.state.value} (had already ended)")
            return
        after = target.rayjobs.get(job_id)
        if after is None or (after.get("metadata") or {}).get("deletionTimestamp"):
            click.echo(f"{job_id}: RayJob deleted; KubeRay stops its Ray job on cluster {before.metadata.get('cluster')}")
            return
        info = target.status(job_id, with_facts=False)
        stopped = True
    deadline = time.monotonic() + 60
    while wait and stopped and not info.state.terminal and time.monotonic() < deadline:
        time.sleep(0.5)
        info = target.status(job_id, with_facts=False)
    click.echo(f"{job_id}: {info.state.value}" + ("" if info.state.terminal else " (stopping)"))
