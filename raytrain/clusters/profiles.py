"""Cluster profiles (``cluster/*.yaml``): what ``raytrain cluster up --profile FILE`` builds. Pure.

Two kinds: ``local`` (the embedded single-node cluster) and ``kuberay`` (a RayCluster on Kubernetes).
Keys may be written kebab-case, snake_case or camelCase; values that are Kubernetes structures
(``node-selector``, ``tolerations``, ``env``, ``labels``) pass through verbatim.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from raytrain import compat
from raytrain.clusters.k8s_names import check_name, check_namespace
from raytrain.errors import ConfigError

KUBERAY_KINDS = ("kuberay", "k8s", "kubernetes")
DEFAULT_RAY_VERSION = "2.60.0"
DEFAULT_IMAGE = f"rayproject/ray:{DEFAULT_RAY_VERSION}-py311-gpu"
DEFAULT_CLUSTER_NAME = "raytrain"

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


@dataclass
class LocalProfile:
    """``kind: local``: the embedded cluster's ``cluster up`` flags."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    port: int | None = None
    dashboard_port: int | None = None
    kind: str = "local"


@dataclass
class PodGroup:
    """Resources and scheduling of one kind of pod (the head, or one worker group)."""

    cpu: str = "2"
    memory: str = "8Gi"
    gpu: int = 0  # nvidia.com/gpu per pod
    shm: str | None = "2Gi"  # /dev/shm as an in-memory emptyDir; None: the runtime's default (64 MiB)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    ray_start_params: dict[str, str] = field(default_factory=dict)


@dataclass
class WorkerGroup(PodGroup):
    group_name: str = "gpu-workers"
    replicas: int = 1
    min_replicas: int | None = None  # default: replicas
    max_replicas: int | None = None  # default: replicas


@dataclass
class Storage:
    """Shared storage for checkpoints: a ReadWriteMany PVC mounted on every pod, or a remote URI."""

    pvc: str | None = None
    mount_path: str = "/mnt/raytrain"
    uri: str | None = None  # s3://bucket/prefix, gs://..., used as Ray Train's storage_path

    @property
    def path(self) -> str | None:
        """What jobs use as --storage by default."""
        return self.uri or (self.mount_path if self.pvc else None)


@dataclass
class RayJobDefaults:
    """Defaults for ``submit --rayjob``."""

    working_dir: str | None = None  # remote URI or a folder baked into the image
    shutdown_after_job_finishes: bool = True
    ttl_seconds_after_finished: int = 600
    active_deadline_seconds: int | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)  # merged into the job's runtime env (pip, ...)


@dataclass
class Preemption:
    """How long a worker pod may take to go away (raytrain.clusters.k8s_manifests.grace_seconds): the time
    planned for one checkpoint save, or the grace period itself."""

    save_seconds: float = 60.0  # one checkpoint's planned save (snapshot, write, upload) on these pods
    grace_seconds: int | None = None  # terminationGracePeriodSeconds as given (else derived from save_seconds)


@dataclass
class Security:
    """What the Ray pods may do. The defaults fit rayproject/ray images (user ``ray``, uid 1000, gid 100)."""

    run_as_user: int | None = 1000  # None: the image's user (then runAsNonRoot is not set)
    run_as_group: int | None = 100
    fs_group: int | None = 100  # volumes (the checkpoint PVC) writable by the pods' group
    automount_service_account_token: bool = False  # true where the pods call the Kubernetes API themselves
    network_policy: bool = True  # admit only the cluster's own pods to any of its pods (the operator: the dashboard)
    # RuntimeDefault (what Pod Security "restricted" requires), Unconfined, Localhost/<path>; null: not set
    seccomp_profile: str | None = "RuntimeDefault"
    operator_namespace: str = "kuberay-system"  # the KubeRay operator's namespace (it polls the head's dashboard)


@dataclass
class K8sProfile:
    """``kind: kuberay``: a RayCluster with a CPU head and one (GPU) worker group."""

    name: str = DEFAULT_CLUSTER_NAME
    namespace: str | None = None  # default: the kubeconfig context's namespace
    ray_version: str = DEFAULT_RAY_VERSION
    image: str = DEFAULT_IMAGE
    image_pull_policy: str | None = None
    service_account: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # NAME: SECRET/KEY (or {secret: S, key: K}): container env read from a Secret (secretKeyRef), never a value
    env_from_secret: dict[str, tuple[str, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    head: PodGroup = field(default_factory=lambda: PodGroup(cpu="2", memory="8Gi", gpu=0, shm="2Gi"))
    workers: WorkerGroup = field(
        default_factory=lambda: WorkerGroup(cpu="8", memory="32Gi", gpu=1, shm="8Gi", replicas=1)
    )
    storage: Storage = field(default_factory=Storage)
    rayjob: RayJobDefaults = field(default_factory=RayJobDefaults)
    security: Security = field(default_factory=Security)
    preemption: Preemption = field(default_factory=Preemption)
    kind: str = "kuberay"


def _snake(key: Any) -> str:
    text = str(key).replace("-", "_")
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", text).lower()


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"--profile {path}: {message}", flag="--profile")


def _build(cls, data: Any, path: str, where: str, nested: dict[str, type] | None = None):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _fail(path, f"'{where}' must be a mapping")
    known = {f.name for f in fields(cls)} - {"kind"}
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = _snake(key)
        if name not in known:
            names = ", ".join(sorted(k.replace("_", "-") for k in known))
            prefix = f"{where}." if where else ""
            raise _fail(path, f"unknown key {prefix}{key!r}; known keys{' of ' + where if where else ''}: {names}")
        if nested and name in nested:
            sub = f"{where}.{key}" if where else str(key)
            base = getattr(cls(), name)
            value = _build_over(base, value, path, sub)
        values[name] = value
    return cls(**values)


def _build_over(base, data: Any, path: str, where: str):
    """``base`` (a default sub-object) with the keys in ``data`` replaced."""
    built = _build(type(base), data, path, where)
    given = {_snake(k) for k in (data or {})}
    for f in fields(base):
        if f.name not in given:
            setattr(built, f.name, getattr(base, f.name))
    return built


def _quantity(path: str, where: str, value: Any) -> str:
    text = str(value)
    if isinstance(value, bool) or not _QUANTITY.match(text):
        raise _fail(path, f"{where} {value!r}: not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    return text


def _int(path: str, where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, f"{where} {value!r}: must be an integer >= {minimum}")
    return value


def _str_map(path: str, where: str, value: Any) -> dict[str, str]:
    if value is None:  # an empty YAML key
        return {}
    if not isinstance(value, dict):
        raise _fail(path, f"{where} must be a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


def _check_group(group: PodGroup, path: str, where: str) -> None:
    group.cpu = _quantity(path, f"{where}.cpu", group.cpu)
    group.memory = _quantity(path, f"{where}.memory", group.memory)
    group.gpu = _int(path, f"{where}.gpu", group.gpu, 0)
    if group.shm in (None, False, "", 0):
        group.shm = None
    else:
        group.shm = _quantity(path, f"{where}.shm", group.shm)
    group.node_selector = _str_map(path, f"{where}.node-selector", group.node_selector)
    group.ray_start_params = _str_map(path, f"{where}.ray-start-params", group.ray_start_params)
    if group.tolerations is None:
        group.tolerations = []
    if not isinstance(group.tolerations, list) or not all(isinstance(t, dict) for t in group.tolerations):
        raise _fail(path, f"{where}.tolerations must be a list of Kubernetes tolerations (mappings)")


def check_k8s_profile(profile: K8sProfile, path: str = "<built-in>") -> K8sProfile:
    """Validate and normalize (quantities as strings, maps of strings). Raises ConfigError."""
    check_name("RayCluster", profile.name, flag="--profile", what=f"--profile {path}: name")
    if profile.namespace is not None:
        check_namespace(profile.namespace, flag="--profile", what=f"--profile {path}: namespace")
    for key in ("image", "ray_version"):
        if not isinstance(getattr(profile, key), str) or not getattr(profile, key):
            raise _fail(path, f"{key.replace('_', '-')} must be a non-empty string")
    problem = compat.ray_version_problem(profile.ray_version, f"profile {path}'s image")
    if problem:  # a cluster raytrain's jobs could not run on: refused before it is made
        raise _fail(path, f"ray-version {profile.ray_version}: {problem}")
    profile.env = _str_map(path, "env", profile.env)
    profile.labels = _str_map(path, "labels", profile.labels)
    profile.env_from_secret = _secret_refs(path, profile.env_from_secret)
    clash = sorted(set(profile.env) & set(profile.env_from_secret))
    if clash:
        raise _fail(path, f"env and env-from-secret both set {', '.join(clash)}: keep one")
    _check_group(profile.head, path, "head")
    _check_group(profile.workers, path, "workers")
    pre = profile.preemption
    if isinstance(pre.save_seconds, bool) or not isinstance(pre.save_seconds, (int, float)) or \
            not 0 < pre.save_seconds < 86400:
        raise _fail(path, f"preemption.save-seconds {pre.save_seconds!r}: must be a number of seconds > 0, "
                          "e.g. 60")
    if pre.grace_seconds is not None:
        pre.grace_seconds = _int(path, "preemption.grace-seconds", pre.grace_seconds, 0)
    w = profile.workers
    w.replicas = _int(path, "workers.replicas", w.replicas, 0)
    if w.min_replicas is not None:
        w.min_replicas = _int(path, "workers.min-replicas", w.min_replicas, 0)
    if w.max_replicas is not None:
        w.max_replicas = _int(path, "workers.max-replicas", w.max_replicas, max(1, w.replicas))
    if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", str(w.group_name)):
        raise _fail(path, f"workers.group-name {w.group_name!r}: use lowercase letters, digits and '-'")
    if profile.storage.pvc is not None and not str(profile.storage.mount_path).startswith("/"):
        raise _fail(path, "storage.mount-path must be an absolute path")
    rj = profile.rayjob
    rj.ttl_seconds_after_finished = _int(path, "rayjob.ttl-seconds-after-finished", rj.ttl_seconds_after_finished, 0)
    if rj.active_deadline_seconds is not None:
        rj.active_deadline_seconds = _int(path, "rayjob.active-deadline-seconds", rj.active_deadline_seconds, 1)
    if rj.runtime_env is None:
        rj.runtime_env = {}
    if not isinstance(rj.runtime_env, dict):
        raise _fail(path, "rayjob.runtime-env must be a mapping (a Ray runtime_env)")
    _check_security(profile.security, path)
    return profile


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def _secret_refs(path: str, value: Any) -> dict[str, tuple[str, str]]:
    """``env-from-secret``: {NAME: "SECRET/KEY" or {secret: SECRET, key: KEY}} -> {NAME: (SECRET, KEY)}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, "env-from-secret must be a mapping NAME: SECRET/KEY (e.g. WANDB_API_KEY: wandb/api-key)")
    out: dict[str, tuple[str, str]] = {}
    for name, ref in value.items():
        if isinstance(ref, (tuple, list)) and len(ref) == 2:
            secret, key = (str(x) for x in ref)
        elif isinstance(ref, dict) and set(ref) == {"secret", "key"}:
            secret, key = str(ref["secret"]), str(ref["key"])
        elif isinstance(ref, str):
            secret, _, key = ref.partition("/")
        else:
            secret = key = ""
        if not _ENV_NAME.match(str(name)) or not _SECRET_NAME.match(secret) or not _SECRET_KEY.match(key):
            raise _fail(path, f"env-from-secret {name}: {ref!r}: expected NAME: SECRET/KEY "
                              "(e.g. WANDB_API_KEY: wandb/api-key)")
        if str(name).startswith("RAY_AUTH_"):
            raise _fail(path, f"env-from-secret {name}: raytrain sets RAY_AUTH_* itself (token auth)")
        out[str(name)] = (secret, key)
    return out


_K8S_NESTED = {
    "head": PodGroup, "workers": WorkerGroup, "storage": Storage, "rayjob": RayJobDefaults, "security": Security,
    "preemption": Preemption,
}


def _check_security(sec: Security, path: str) -> None:
    for key in ("run_as_user", "run_as_group", "fs_group"):
        if getattr(sec, key) is not None:
            _int(path, f"security.{key.replace('_', '-')}", getattr(sec, key), 0)
    for key in ("automount_service_account_token", "network_policy"):
        if not isinstance(getattr(sec, key), bool):
            raise _fail(path, f"security.{key.replace('_', '-')} {getattr(sec, key)!r}: must be true or false")
    check_namespace(sec.operator_namespace, flag="--profile", what=f"--profile {path}: security.operator-namespace")
    seccomp = sec.seccomp_profile
    if seccomp is not None and not (
        seccomp in ("RuntimeDefault", "Unconfined")
        or (isinstance(seccomp, str) and seccomp.startswith("Localhost/") and len(seccomp) > len("Localhost/"))
    ):
        raise _fail(path, f"security.seccomp-profile {seccomp!r}: use RuntimeDefault, Unconfined, "
                          "Localhost/<profile path> or null")


def parse_cluster_profile(data: Any, path: str = "<profile>") -> LocalProfile | K8sProfile:
    if not isinstance(data, dict):
        raise _fail(path, "expected a mapping with `kind: local` or `kind: kuberay`")
    data = dict(data)
    kind = str(data.pop("kind", "")).lower()
    if kind == "local":
        profile = _build(LocalProfile, data, path, "")
        for key in ("num_cpus", "num_gpus"):
            value = getattr(profile, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise _fail(path, f"{key.replace('_', '-')} {value!r}: must be a number >= 0")
        for key in ("port", "dashboard_port"):
            value = getattr(profile, key)
            if value is not None:
                _int(path, key.replace("_", "-"), value, 1)
        return profile
    if kind in KUBERAY_KINDS:
        return check_k8s_profile(_build(K8sProfile, data, path, "", nested=_K8S_NESTED), path)
    raise _fail(path, f"kind {kind or None!r}: use `kind: local` or `kind: kuberay`")


def load_cluster_profile(path: str | Path) -> LocalProfile | K8sProfile:
    p = Path(path).expanduser()
    if not p.is_file():
        raise _fail(str(path), "no such file")
    import yaml

    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(str(path), f"cannot parse: {first}") from exc
    return parse_cluster_profile(data, str(path))


def default_k8s_profile() -> K8sProfile:
    return check_k8s_profile(K8sProfile())


def load_k8s_profile(path: str | Path | None) -> K8sProfile:
    """--profile for a Kubernetes command (the built-in default without one); a `kind: local` profile is refused."""
    if not path:
        return default_k8s_profile()
    profile = load_cluster_profile(path)
    if not isinstance(profile, K8sProfile):
        raise ConfigError(f"--profile {path}: a `kind: local` profile cannot be used with --k8s", flag="--profile")
    return profile
