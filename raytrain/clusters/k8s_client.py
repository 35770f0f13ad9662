"""The Kubernetes API, as raytrain uses it: kubeconfig and context like kubectl, KubeRay custom objects,
and every failure turned into one line (ClusterError/ConfigError, exit 2).

Imported only when a command is given ``--k8s``: the rest of raytrain never loads the kubernetes client.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain.clusters.k8s_manifests import FIELD_MANAGER, GROUP, VERSION
from raytrain.clusters.k8s_names import check_namespace
from raytrain.errors import ClusterError, ConfigError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
INSTALL_HINT = (
    "install the KubeRay operator first: helm install kuberay-operator kuberay/kuberay-operator "
    "(see k8s/README.md)"
)


class NotFound(ClusterError):
    """The object (or the API path) does not exist."""


class Forbidden(ClusterError):
    """The credentials are good but may not do this (HTTP 403: RBAC)."""


@dataclass
class KubeconfigSource:
    paths: list[str]  # the files kubectl would read, in order
    description: str  # for messages: where they came from


def find_kubeconfig(explicit: str | None = None) -> KubeconfigSource | None:
    """Like kubectl: --kubeconfig, else $KUBECONFIG (a path list; missing entries are skipped), else
    ~/.kube/config. None means no file: only an in-cluster service account can help then."""
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file():
            raise ClusterError(f"--kubeconfig {explicit}: no such file")
        return KubeconfigSource([str(p)], f"--kubeconfig {explicit}")
    env = os.environ.get("KUBECONFIG")
    if env:
        found = [str(Path(x).expanduser()) for x in env.split(os.pathsep) if x and Path(x).expanduser().is_file()]
        if not found:
            raise ClusterError(
                f"no kubeconfig: KUBECONFIG={env} names no existing file; point it at your cluster's kubeconfig"
            )
        return KubeconfigSource(found, f"KUBECONFIG={env}")
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return KubeconfigSource([str(default)], str(default))
    return None


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and Path(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ).is_file()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


class Kube:
    """One API server, reached through one kubeconfig context."""

    def __init__(self, api_client: Any, *, server: str, context: str, namespace: str):
        self.api_client = api_client
        self.server = server
        self.context = context
        self.namespace = namespace  # the context's namespace (kubectl's default for -n)
        self._groups: dict[str, set[str]] = {}

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> "Kube":
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        # urllib3 logs each retry as a warning on stderr; raytrain reports the outcome in one line.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        source = find_kubeconfig(kubeconfig)
        configuration = client.Configuration()
        if source is None:
            if not _in_cluster():
                raise ClusterError(
                    "no kubeconfig: ~/.kube/config does not exist and KUBECONFIG is not set; "
                    "point KUBECONFIG (or --kubeconfig) at your cluster's kubeconfig"
                )
            config.load_incluster_config(client_configuration=configuration)
            ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            namespace = ns_file.read_text().strip() if ns_file.is_file() else "default"
            context_name = "in-cluster"
        else:
            joined = os.pathsep.join(source.paths)
            try:
                contexts, current = config.list_kube_config_contexts(config_file=joined)
                chosen = current
                if context:
                    chosen = next((c for c in contexts if c.get("name") == context), None)
                    if chosen is None:
                        names = ", ".join(sorted(c.get("name", "") for c in contexts)) or "none"
                        raise ClusterError(f"--context {context}: not in {source.description} (contexts: {names})")
                if not chosen:
                    raise ClusterError(
                        f"kubeconfig {source.description} has no current context; pass --context "
                        "(kubectl config get-contexts lists them)"
                    )
                config.load_kube_config(
                    config_file=joined, context=chosen["name"], client_configuration=configuration,
                    persist_config=False,
                )
            except ConfigException as exc:
                raise ClusterError(f"kubeconfig {source.description}: {_first_line(exc)}") from exc
            except (OSError, ValueError) as exc:  # unreadable file, bad YAML, bad certificate data
                raise ClusterError(f"kubeconfig {source.description}: {_first_line(exc) or type(exc).__name__}") from exc
            namespace = (chosen.get("context") or {}).get("namespace") or "default"
            context_name = chosen["name"]
        configuration.retries = 1
        return cls(
            client.ApiClient(configuration), server=configuration.host, context=context_name, namespace=namespace
        )

    # -- errors ---------------------------------------------------------------------------------------
    def _error(self, exc: BaseException, what: str) -> ClusterError:
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException) and exc.status:
            message = ""
            try:
                body = json.loads(exc.body or "{}")
                message = body.get("message") or ""
            except (ValueError, AttributeError):
                message = _first_line(exc.body or "")
            message = _first_line(message) or exc.reason or ""
            if exc.status == 404:
                return NotFound(f"{what}: not found")
            if exc.status in (401, 403):
                return (Forbidden if exc.status == 403 else ClusterError)(
                    f"the Kubernetes API server at {self.server} refused {what} (HTTP {exc.status}: {message}); "
                    f"check the credentials of context {self.context!r}"
                )
            return ClusterError(f"the Kubernetes API server refused {what} (HTTP {exc.status}): {message}")
        import urllib3

        network = isinstance(exc, (urllib3.exceptions.HTTPError, OSError)) or (
            isinstance(exc, ApiException) and not exc.status  # websocket transport errors
        )
        reason = _first_line(getattr(exc, "reason", None) or exc) or type(exc).__name__
        if not network:
            return ClusterError(f"{what} failed: {type(exc).__name__}: {reason}")
        if "Max retries exceeded" in reason or "Connection refused" in reason or "NewConnectionError" in reason:
            reason = "connection refused or timed out"
        return ClusterError(
            f"cannot reach the Kubernetes API server at {self.server} ({reason}); "
            f"is the cluster of kubeconfig context {self.context!r} up?"
        )

    def call(self, what: str, fn, *args, raw: bool = False, **kwargs) -> Any:
        """Run one API call; JSON bodies come back as dicts (``raw``: as text). Failures become one-line
        ClusterErrors."""
        kwargs.setdefault("_request_timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        kwargs.setdefault("_preload_content", False)
        try:
            resp = fn(*args, **kwargs)
        except Exception as exc:  # ApiException, urllib3 and ssl errors, socket timeouts
            raise self._error(exc, what) from exc
        data = getattr(resp, "data", resp)
        if raw:
            return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data or "")
        if isinstance(data, (bytes, str)):
            return json.loads(data) if data else {}
        return data

    # -- KubeRay custom objects ------------------------------------------------------------------------
    @property
    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    @property
    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    def require_crd(self, plural: str, group: str = GROUP, version: str = VERSION) -> None:
        """ClusterError, one line, unless the API server serves ``plural.group/version`` (a KubeRay CRD)."""
        if group not in self._groups:
            try:
                found = self.call(f"GET /apis/{group}/{version}", self.custom.get_api_resources, group, version)
            except NotFound:
                found = {"resources": []}
            self._groups[group] = {r.get("name") for r in found.get("resources") or []}
        if plural not in self._groups[group]:
            raise ClusterError(
                f"the KubeRay CRD {plural}.{group} ({version}) is not installed on {self.server}: {INSTALL_HINT}"
            )


    def crd_schema(self, plural: str, group: str = GROUP, version: str = VERSION) -> dict | None:
        """The openAPIV3Schema of CRD ``plural.group`` at ``version`` as installed; None where this user may
        not read CRDs (they are cluster-scoped: many namespace users cannot)."""
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self.api_client)
        try:
            crd = self.call(f"read CRD {plural}.{group}", ext.read_custom_resource_definition, f"{plural}.{group}")
        except Forbidden:
            return None
        except NotFound:
            raise ClusterError(
                f"the KubeRay CRD {plural}.{group} ({version}) is not installed on {self.server}: {INSTALL_HINT}"
            ) from None
        for v in (crd.get("spec") or {}).get("versions") or []:
            if v.get("name") == version:
                return ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
        return {}


def schema_at(schema: dict, *path: str) -> dict | None:
    """The sub-schema of ``schema`` at the property ``path`` (None where the schema does not name it)."""
    for key in path:
        props = (schema or {}).get("properties") or {}
        if key not in props:
            return None
        schema = props[key]
    return schema


def auth_options_known(kube: Kube, plural: str) -> bool:
    """Whether the installed KubeRay CRD (``rayclusters``: spec.authOptions; ``rayjobs``: its rayClusterSpec's)
    knows ``authOptions`` (KubeRay >= 1.5.1). True where the CRD cannot be read (no permission): then the
    server-side apply itself refuses the field on an older KubeRay."""
    schema = kube.crd_schema(plural)
    if schema is None:
        return True
    path = ("spec", "authOptions") if plural == "rayclusters" else ("spec", "rayClusterSpec", "authOptions")
    return schema_at(schema, *path) is not None


class RayObjects:
    """Custom objects of one KubeRay kind (``rayclusters``, ``rayjobs``) in one namespace."""

    def __init__(self, kube: Kube, plural: str, namespace: str, *, group: str = GROUP, version: str = VERSION):
        self.kube, self.plural, self.namespace = kube, plural, namespace
        self.group, self.version = group, version
        self.kind = {"rayclusters": "RayCluster", "rayjobs": "RayJob"}.get(plural, plural)

    def _what(self, verb: str, name: str | None = None) -> str:
        return f"{verb} {self.kind} {self.namespace}/{name}" if name else f"{verb} {self.plural} in {self.namespace}"

    def require(self) -> None:
        self.kube.require_crd(self.plural, self.group, self.version)

    def get(self, name: str) -> dict | None:
        self.require()
        try:
            return self.kube.call(
                self._what("get", name), self.kube.custom.get_namespaced_custom_object,
                self.group, self.version, self.namespace, self.plural, name,
            )
        except NotFound:
            return None

    def list(self, label_selector: str | None = None) -> list[dict]:
        self.require()
        kwargs = {"label_selector": label_selector} if label_selector else {}
        out = self.kube.call(
            self._what("list"), self.kube.custom.list_namespaced_custom_object,
            self.group, self.version, self.namespace, self.plural, **kwargs,
        )
        return list(out.get("items") or [])

    def apply(self, manifest: dict, *, force: bool = True) -> dict:
        """Server-side apply (field manager ``raytrain``): creates or updates; a no-op when nothing changed."""
        self.require()
        name = manifest["metadata"]["name"]
        return self.kube.call(
            self._what("apply", name), self.kube.custom.patch_namespaced_custom_object,
            self.group, self.version, self.namespace, self.plural, name, manifest,
            field_manager=FIELD_MANAGER, force=force, _content_type="application/apply-patch+yaml",
        )

    def merge_patch(self, name: str, patch: dict, *, status: bool = False) -> dict:
        self.require()
        fn = (
            self.kube.custom.patch_namespaced_custom_object_status
            if status
            else self.kube.custom.patch_namespaced_custom_object
        )
        try:
            return self.kube.call(
                self._what("patch", name), fn, self.group, self.version, self.namespace, self.plural, name, patch,
                _content_type="application/merge-patch+json",
            )
        except NotFound:
            raise NotFound(f"no {self.kind} {name!r} in namespace {self.namespace}") from None

    def delete(self, name: str) -> bool:
        """True if it existed (deletion is then under way)."""
        self.require()
        try:
            self.kube.call(
                self._what("delete", name), self.kube.custom.delete_namespaced_custom_object,
                self.group, self.version, self.namespace, self.plural, name,
            )
        except NotFound:
            return False
        return True


def resolve_namespace(kube_or_none: Kube | None, *candidates: str | None) -> str:
    """The first namespace given (flag, profile), else the kubeconfig context's (kubectl's rule)."""
    for ns in candidates:
        if ns:
            return check_namespace(ns)
    if kube_or_none is None:
        raise ConfigError("no namespace: pass --namespace", flag="--namespace")
    return check_namespace(kube_or_none.namespace, what=f"the namespace of context {kube_or_none.context!r}")


class KubeConnection:
    """Connects on first use, so that a dry run with everything given reads no kubeconfig."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None, *, kube: Kube | None = None):
        self.kubeconfig, self.context = kubeconfig, context
        self._kube = kube

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube.connect(self.kubeconfig, self.context)
        return self._kube

    def namespace(self, *candidates: str | None) -> str:
        if any(candidates):
            return resolve_namespace(None, *candidates)
        return resolve_namespace(self.kube)
