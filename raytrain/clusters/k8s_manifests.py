"""KubeRay manifests (RayCluster, RayJob) rendered from a cluster profile and a plan. Pure: no client, no I/O.

What is rendered here is exactly what ``--dry-run`` prints and what ``submit``/``cluster up`` apply.
"""
from __future__ import annotations

import math
import re
import secrets
import time
from typing import Any

from raytrain.capacity import Node
from raytrain.clusters.k8s_names import MAX_NAME, check_name, check_namespace
from raytrain.clusters.profiles import K8sProfile, PodGroup
from raytrain.errors import ConfigError

GROUP = "ray.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

MANAGED_BY = "app.kubernetes.io/managed-by"
NAME_LABEL = "raytrain.io/name"
STORAGE_ANNOTATION = "raytrain.io/storage"
FIELD_MANAGER = "raytrain"

DASHBOARD_PORT = 8265
HEAD_PORTS = [
    {"containerPort": 6379, "name": "gcs-server"},
    {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
    {"containerPort": 10001, "name": "client"},
]
SHM_VOLUME = "dshm"
STORAGE_VOLUME = "raytrain-storage"
# Ray's token auth: the token lives in a Secret raytrain creates (never in a manifest). The RayCluster spec names
# it in `authOptions` (KubeRay >= 1.5.1: the operator then injects it into every Ray container, the init and
# submitter containers, and sends it on its own dashboard calls, which a RayJob's status depends on); the Ray
# containers also read it through secretKeyRef, so a KubeRay whose schema prunes `authOptions` still runs an
# authenticated Ray (the operator skips env a container already has).
CLUSTER_LABEL = "raytrain.io/cluster"  # on every pod of one raytrain RayCluster or RayJob (NetworkPolicy)
AUTH_SECRET_KEY = "auth_token"  # the key KubeRay's authOptions.secretName requires
LEGACY_AUTH_SECRET_KEY = "token"  # Secrets made by raytrain before authOptions
KUBERAY_AUTH_VERSION = "1.5.1"  # the first KubeRay with spec.authOptions
SUBMITTER_CONTAINER = "ray-job-submitter"  # the container of KubeRay's submitter Job (K8sJobMode)


def auth_secret_name(owner: str) -> str:
    """The Secret holding the Ray auth token of RayCluster (or RayJob) ``owner``."""
    return f"{owner}-raytrain-auth"


def network_policy_name(owner: str) -> str:
    return f"{owner}-raytrain-head"


def _auth_env(owner: str, *, optional: bool = False) -> list[dict[str, Any]]:
    ref: dict[str, Any] = {"name": auth_secret_name(owner), "key": AUTH_SECRET_KEY}
    if optional:
        ref["optional"] = True
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": ref}},
    ]


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def auth_options(owner: str) -> dict[str, Any]:
    """The RayCluster spec's ``authOptions``: token auth with raytrain's Secret (KubeRay makes none then)."""
    return {"mode": "token", "secretName": auth_secret_name(owner)}


def _seccomp(value: str) -> dict[str, Any]:
    if value.startswith("Localhost/"):
        return {"type": "Localhost", "localhostProfile": value.split("/", 1)[1]}
    return {"type": value}


def _pod_security(profile: K8sProfile) -> dict[str, Any]:
    sec = profile.security
    out: dict[str, Any] = {}
    if sec.seccomp_profile:  # Pod Security "restricted" requires RuntimeDefault (or Localhost)
        out["seccompProfile"] = _seccomp(sec.seccomp_profile)
    if sec.run_as_user is not None:
        out["runAsUser"] = sec.run_as_user
        out["runAsNonRoot"] = sec.run_as_user != 0
    if sec.run_as_group is not None:
        out["runAsGroup"] = sec.run_as_group
    if sec.fs_group is not None:
        out["fsGroup"] = sec.fs_group
    return out


def render_auth_secret(owner: str, namespace: str, profile: K8sProfile, token: str) -> dict[str, Any]:
    """The Secret with the token: applied by raytrain, never printed (--dry-run shows only its name)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": auth_secret_name(owner), "namespace": namespace,
                     "labels": _labels(profile, **{CLUSTER_LABEL: owner})},
        "stringData": {AUTH_SECRET_KEY: token},
    }


def render_network_policy(owner: str, namespace: str, profile: K8sProfile) -> dict[str, Any]:
    """Only the pods of this cluster reach any of its pods: the head (GCS, dashboard, client ports) and the
    workers (raylet, object manager, rank 0's rendezvous store, gloo/NCCL); the KubeRay operator's namespace
    reaches the dashboard port, which only the head listens on (it polls job status there). A port-forward
    (through the API server and kubelet) is not affected."""
    own = {"podSelector": {"matchLabels": {CLUSTER_LABEL: owner}}}
    operator = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": profile.security.operator_namespace}}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": network_policy_name(owner), "namespace": namespace,
                     "labels": _labels(profile, **{CLUSTER_LABEL: owner})},
        "spec": {
            "podSelector": {"matchLabels": {CLUSTER_LABEL: owner}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [own]},
                {"from": [operator], "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]},
            ],
        },
    }


def security_manifests(owner: str, namespace: str, profile: K8sProfile) -> list[dict[str, Any]]:
    """What raytrain applies next to a RayCluster or RayJob besides the token Secret (printed by --dry-run)."""
    return [render_network_policy(owner, namespace, profile)] if profile.security.network_policy else []


def rayjob_name(job_name: str) -> str:
    """A fresh RayJob name for one submission: ``<job>-<yymmdd-hhmmss>-<hex4>`` (a valid, short DNS label).

    Chosen once, client-side, by the dry run; the submit applies exactly that name, so a retried
    submission finds its RayJob instead of starting the job twice.
    """
    slug = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)
    if not slug or not slug[0].isalpha():
        slug = f"job-{slug}".rstrip("-")
    suffix = f"{time.strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    slug = slug[: MAX_NAME["RayJob"] - len(suffix) - 1].rstrip("-")
    return f"{slug}-{suffix}"


# -- quantities ---------------------------------------------------------------------------------------
_SUFFIX = {
    "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity ("500m", "16Gi", 4) as a number."""
    match = re.match(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$", str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


# -- RayCluster -----------------------------------------------------------------------------------------
def _labels(profile: K8sProfile, **extra: str) -> dict[str, str]:
    return {**profile.labels, MANAGED_BY: "raytrain", **extra}


def _container_resources(group: PodGroup) -> dict[str, Any]:
    amounts = {"cpu": str(group.cpu), "memory": str(group.memory)}
    if group.gpu:
        amounts["nvidia.com/gpu"] = str(group.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _secret_env(secret_env: dict[str, tuple[str, str]] | None) -> list[dict[str, Any]]:
    """The profile's ``env-from-secret`` and ``--env-from-secret``: {NAME: (SECRET, KEY)} as container env
    read from Secrets (the value is never in the object, the runtime env or --dry-run output)."""
    return [{"name": n, "valueFrom": {"secretKeyRef": {"name": sec, "key": key}}}
            for n, (sec, key) in (secret_env or {}).items()]


def secret_env_of(profile: K8sProfile, flag: dict[str, tuple[str, str]] | None = None) -> dict[str, tuple[str, str]]:
    """The profile's env-from-secret, with --env-from-secret's entries winning."""
    return {**profile.env_from_secret, **(flag or {})}


PREEMPT_FILE = "/tmp/raytrain-preempt"  # the worker pods' preStop writes it; the workers watch it (RAYTRAIN_PREEMPT_FILE)
GRACE_MARGIN_S = 30  # shutdown after the save: the workers' exit, Ray's own stop


def grace_seconds(profile: K8sProfile) -> int:
    """A worker pod's terminationGracePeriodSeconds: the profile's ``preemption.grace-seconds`` where given,
    else twice the planned save time (``preemption.save-seconds``: a save started late in a step still ends
    in time) plus ``GRACE_MARGIN_S``."""
    pre = profile.preemption
    if pre.grace_seconds is not None:
        return int(pre.grace_seconds)
    return int(math.ceil(2 * float(pre.save_seconds))) + GRACE_MARGIN_S


def prestop_hook(grace: int) -> dict[str, Any]:
    """The preStop hook that gives raytrain the notice: the deadline (seconds since the epoch, a few seconds
    before the kubelet's SIGKILL) into ``PREEMPT_FILE``, then a wait until the workers have committed their
    checkpoint (they write ``PREEMPT_FILE.done``) or the grace period is nearly over. Kubernetes sends the
    container its SIGTERM (which stops Ray) only after this returns."""
    wait = max(grace - 5, 0)
    script = (f"echo $(( $(date +%s) + {wait} )) > {PREEMPT_FILE}.tmp && mv {PREEMPT_FILE}.tmp {PREEMPT_FILE}; "
              f"i=0; while [ ! -e {PREEMPT_FILE}.done ] && [ $i -lt {wait} ]; do sleep 1; i=$((i+1)); done")
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", script]}}}


def _pod_template(
    profile: K8sProfile, group: PodGroup, container_name: str, *, head: bool, owner: str = "",
    secret_env: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """One Ray pod: ``owner`` (the RayCluster's or RayJob's name) labels it and names its auth Secret."""
    container: dict[str, Any] = {"name": container_name, "image": profile.image}
    if profile.image_pull_policy:
        container["imagePullPolicy"] = profile.image_pull_policy
    if head:
        container["ports"] = [dict(p) for p in HEAD_PORTS]
    container["resources"] = _container_resources(group)
    secret_env = secret_env_of(profile, secret_env)
    env = [{"name": k, "value": v} for k, v in profile.env.items() if k not in secret_env] + _secret_env(secret_env)
    env += _auth_env(owner) if owner else []
    if not head:  # the workers watch the preStop's notice file (raytrain.runtime.worker.preemption)
        env.append({"name": "RAYTRAIN_PREEMPT_FILE", "value": PREEMPT_FILE})
        container["lifecycle"] = prestop_hook(grace_seconds(profile))
    if env:
        container["env"] = env
    container["securityContext"] = dict(CONTAINER_SECURITY)
    mounts, volumes = [], []
    if group.shm:
        # NCCL and PyTorch data loaders need more shared memory than a container's default 64 MiB.
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(group.shm)}})
    if profile.storage.pvc:
        mounts.append({"name": STORAGE_VOLUME, "mountPath": profile.storage.mount_path})
        volumes.append({"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": profile.storage.pvc}})
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict[str, Any] = {}
    if profile.service_account:
        spec["serviceAccountName"] = profile.service_account
    spec["automountServiceAccountToken"] = profile.security.automount_service_account_token
    if _pod_security(profile):
        spec["securityContext"] = _pod_security(profile)
    if group.node_selector:
        spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        spec["tolerations"] = [dict(t) for t in group.tolerations]
    if not head:  # time for a preemption checkpoint between the preStop's notice and the kill
        spec["terminationGracePeriodSeconds"] = grace_seconds(profile)
    spec["containers"] = [container]
    if volumes:
        spec["volumes"] = volumes
    return {"metadata": {"labels": {CLUSTER_LABEL: owner}}, "spec": spec} if owner else {"spec": spec}


def render_raycluster_spec(
    profile: K8sProfile, *, owner: str = "", worker_replicas: int | None = None,
    secret_env: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The RayCluster spec: CPU head (no Ray work scheduled on it), one worker group, head Service ClusterIP;
    token auth with the Secret of ``owner`` (the RayCluster, or the RayJob that brings its own cluster)."""
    w = profile.workers
    replicas = w.replicas if worker_replicas is None else worker_replicas
    head_params = {"dashboard-host": "0.0.0.0", "num-cpus": "0", **profile.head.ray_start_params}
    sized = worker_replicas is not None  # a RayJob's own cluster: exactly the pods the job needs
    worker_group: dict[str, Any] = {
        "groupName": w.group_name,
        "replicas": replicas,
        "minReplicas": replicas if sized or w.min_replicas is None else w.min_replicas,
        "maxReplicas": replicas if sized or w.max_replicas is None else max(replicas, w.max_replicas),
        "rayStartParams": dict(w.ray_start_params),
        "template": _pod_template(profile, w, "ray-worker", head=False, owner=owner, secret_env=secret_env),
    }
    spec: dict[str, Any] = {"rayVersion": profile.ray_version}
    if owner:
        spec["authOptions"] = auth_options(owner)
    return {
        **spec,
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            # The dashboard (Jobs API) stays inside the cluster: reach it with a port-forward.
            "serviceType": "ClusterIP",
            "rayStartParams": head_params,
            "template": _pod_template(
                profile, profile.head, "ray-head", head=True, owner=owner, secret_env=secret_env
            ),
        },
        "workerGroupSpecs": [worker_group],
    }


def render_raycluster(profile: K8sProfile, name: str, namespace: str) -> dict[str, Any]:
    check_name("RayCluster", name, flag="--name")
    check_namespace(namespace)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": _labels(profile)}
    if profile.storage.path:
        metadata["annotations"] = {STORAGE_ANNOTATION: profile.storage.path}
    spec = render_raycluster_spec(profile, owner=name)
    return {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata, "spec": spec}


# -- capacity as Ray will see it ------------------------------------------------------------------------
def _container_ray_resources(template: dict, params: dict) -> dict[str, float]:
    containers = ((template or {}).get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}
    amounts = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    out: dict[str, float] = {}
    cpu = params.get("num-cpus", amounts.get("cpu"))
    gpu = params.get("num-gpus", amounts.get("nvidia.com/gpu"))
    try:
        out["CPU"] = float(math.floor(parse_quantity(cpu))) if cpu is not None else 0.0
        out["GPU"] = parse_quantity(gpu) if gpu is not None else 0.0
    except ValueError:
        pass
    return out


def nodes_from_spec(spec: dict[str, Any]) -> list[Node]:
    """The Ray nodes a RayCluster spec yields at full size (KubeRay sets num-cpus/num-gpus from the pods)."""
    head = spec.get("headGroupSpec") or {}
    nodes = [Node("head", "head", _container_ray_resources(head.get("template"), head.get("rayStartParams") or {}))]
    for group in spec.get("workerGroupSpecs") or []:
        count = max(int(group.get("replicas") or 0), int(group.get("maxReplicas") or 0))
        res = _container_ray_resources(group.get("template"), group.get("rayStartParams") or {})
        nodes += [Node(f"{group.get('groupName')}-{i}", group.get("groupName", ""), dict(res)) for i in range(count)]
    return nodes


def worker_pods_needed(profile: K8sProfile, num_workers: int, per_worker: dict[str, float]) -> int:
    """How many worker pods of the profile hold ``num_workers`` Ray Train workers. ConfigError if none fits."""
    pod = _container_ray_resources(
        _pod_template(profile, profile.workers, "ray-worker", head=False), profile.workers.ray_start_params
    )
    fit = math.inf
    for key, need in per_worker.items():
        if need > 0:
            fit = min(fit, math.floor(pod.get(key, 0.0) / need + 1e-9))
    if fit == 0:
        each = " + ".join(f"{v:g} {k}" for k, v in per_worker.items() if v > 0)
        has = f"{pod.get('CPU', 0):g} CPU, {pod.get('GPU', 0):g} GPU"
        hint = (
            "use --gpus-per-worker 0 (CPU workers) or a profile whose workers have `gpu:`"
            if per_worker.get("GPU", 0) > 0 and not pod.get("GPU")
            else "lower --cpus-per-worker/--gpus-per-worker or give the profile's workers more"
        )
        raise ConfigError(
            f"one worker needs {each}, but a worker pod of the profile has {has}: {hint}", flag="--profile"
        )
    per_pod = 1 if fit is math.inf else int(fit)
    return max(1, math.ceil(num_workers / per_pod))


# -- RayJob ----------------------------------------------------------------------------------------------
def render_rayjob(
    *,
    name: str,
    namespace: str,
    entrypoint: str,
    runtime_env: dict[str, Any],
    metadata: dict[str, str],
    profile: K8sProfile,
    cluster: str | None,
    worker_replicas: int,
    secret_env: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A RayJob that runs ``entrypoint`` on the named RayCluster (clusterSelector) or on its own cluster
    (whose pods get ``secret_env``, --env-from-secret)."""
    import yaml

    check_name("RayJob", name, flag="--submission-id")
    check_namespace(namespace)
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "jobId": name,  # the Ray submission id: the operator's submit is idempotent too
        "metadata": {k: str(v) for k, v in metadata.items()},
        "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True, default_flow_style=False),
        "submissionMode": "K8sJobMode",
    }
    if profile.rayjob.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = profile.rayjob.active_deadline_seconds
    if cluster:
        check_name("RayCluster", cluster, flag="--cluster")
        # An existing cluster is not ours to shut down (and KubeRay forbids a TTL without shutdown).
        spec["clusterSelector"] = {"ray.io/cluster": cluster}
        spec["shutdownAfterJobFinishes"] = False
    else:
        spec["shutdownAfterJobFinishes"] = bool(profile.rayjob.shutdown_after_job_finishes)
        if spec["shutdownAfterJobFinishes"]:
            spec["ttlSecondsAfterFinished"] = profile.rayjob.ttl_seconds_after_finished
        spec["rayClusterSpec"] = render_raycluster_spec(
            profile, owner=name, worker_replicas=worker_replicas, secret_env=secret_env
        )
    # A RayCluster made by raytrain has a token Secret; one made otherwise may not (then no token is sent).
    spec["submitterPodTemplate"] = _submitter_template(profile, cluster or name, optional=bool(cluster))
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": _labels(profile, **{NAME_LABEL: _label_value(metadata.get("name", ""))}),
        },
        "spec": spec,
    }


def _submitter_template(profile: K8sProfile, owner: str, *, optional: bool) -> dict[str, Any]:
    """KubeRay's submitter pod (it runs `ray job submit`; KubeRay fills in the command) with the token."""
    amounts = {"cpu": "1", "memory": "1Gi"}  # KubeRay's own default for the submitter
    container = {
        "name": SUBMITTER_CONTAINER, "image": profile.image, "env": _auth_env(owner, optional=optional),
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": dict(CONTAINER_SECURITY),
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container],
        "automountServiceAccountToken": profile.security.automount_service_account_token,
    }
    if _pod_security(profile):
        spec["securityContext"] = _pod_security(profile)
    return {"metadata": {"labels": {CLUSTER_LABEL: owner}}, "spec": spec}


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    return value


def to_yaml(documents: list[dict[str, Any]]) -> str:
    """Manifests as `kubectl apply -f -` reads them (one document each, in order)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, data):  # multi-line strings (runtimeEnvYAML) as literal blocks
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False) for d in documents)


# -- an existing RayCluster ------------------------------------------------------------------------------
def _templates(spec: dict[str, Any]) -> list[dict[str, Any]]:
    head = (spec.get("headGroupSpec") or {}).get("template") or {}
    return [head, *((g.get("template") or {}) for g in spec.get("workerGroupSpecs") or [])]


def _ray_container_env(template: dict[str, Any]) -> list[dict[str, Any]]:
    containers = ((template.get("spec") or {}).get("containers")) or [{}]
    return list(containers[0].get("env") or [])  # the Ray container is the first (KubeRay's rule)


def require_secret_env(cluster: dict[str, Any], secret_env: dict[str, tuple[str, str]], flag: str) -> None:
    """``--env-from-secret`` with an existing RayCluster: its pods already run, so their env cannot change. Accepted
    where every Ray container already reads NAME from SECRET/KEY; else one line naming the profile key."""
    spec, name = cluster.get("spec") or {}, (cluster.get("metadata") or {}).get("name", "")
    missing = []
    for env_name, (secret, key) in secret_env.items():
        want = {"secretKeyRef": {"name": secret, "key": key}}
        for template in _templates(spec):
            found = [e for e in _ray_container_env(template) if e.get("name") == env_name]
            ref = ((found[0].get("valueFrom") or {}).get("secretKeyRef") or {}) if found else {}
            if {"secretKeyRef": {"name": ref.get("name"), "key": ref.get("key")}} != want:
                missing.append(f"{env_name}={secret}/{key}")
                break
    if missing:
        raise ConfigError(
            f"{flag} {', '.join(missing)}: the pods of RayCluster {name} already run and do not read it; put it in "
            f"the RayCluster's profile (`env-from-secret: {{{missing[0].split('=')[0]}: "
            f"{missing[0].split('=', 1)[1]}}}`) and re-create the cluster (`raytrain cluster down`, then `up`)",
            flag=flag,
        )


def uses_hand_set_auth(cluster: dict[str, Any]) -> bool:
    """A RayCluster whose Ray requires a token but whose spec has no ``authOptions`` (made on a KubeRay older
    than 1.5.1, or by an older raytrain): KubeRay's operator sends no token to it."""
    spec = cluster.get("spec") or {}
    if (spec.get("authOptions") or {}).get("mode") == "token":
        return False
    return any(e.get("name") == "RAY_AUTH_MODE" and e.get("value") == "token"
               for t in _templates(spec) for e in _ray_container_env(t))
