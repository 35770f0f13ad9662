"""The Kubernetes objects that guard a raytrain RayCluster or RayJob: the Secret with its Ray auth token and
the NetworkPolicy in front of its pods (rendered in k8s_manifests). The token is made here, stored only in
the Secret, and read back by raytrain's own client (the port-forward path); it never appears in a manifest
or in --dry-run output."""
from __future__ import annotations

import base64
import secrets
from typing import Any

from raytrain.clusters.k8s_client import FIELD_MANAGER, Kube, NotFound
from raytrain.clusters.k8s_manifests import (
    AUTH_SECRET_KEY,
    LEGACY_AUTH_SECRET_KEY,
    auth_secret_name,
    network_policy_name,
    render_auth_secret,
    security_manifests,
)
from raytrain.clusters.profiles import K8sProfile

APPLY = "application/apply-patch+yaml"


class ClusterGuard:
    """The token Secret and NetworkPolicy of one owner (a RayCluster or RayJob name) in one namespace."""

    def __init__(self, kube: Kube, namespace: str):
        self.kube, self.namespace = kube, namespace

    @property
    def networking(self):
        from kubernetes import client

        return client.NetworkingV1Api(self.kube.api_client)

    def secrets_served(self) -> bool:
        """False only on an API server without the core API (the loopback test server serves CRDs only)."""
        found = self.kube.call("GET /api/v1", self.kube.core.get_api_resources)
        return any(r.get("name") == "secrets" for r in found.get("resources") or [])

    def _read(self, owner: str) -> dict[str, str] | None:
        try:
            obj = self.kube.call(
                f"read Secret {self.namespace}/{auth_secret_name(owner)}", self.kube.core.read_namespaced_secret,
                auth_secret_name(owner), self.namespace,
            )
        except NotFound:
            return None
        return {k: base64.b64decode(v).decode().strip() for k, v in (obj.get("data") or {}).items() if v}

    def read_token(self, owner: str) -> str | None:
        data = self._read(owner) or {}
        return data.get(AUTH_SECRET_KEY) or data.get(LEGACY_AUTH_SECRET_KEY)

    def ensure(self, owner: str, profile: K8sProfile) -> bool:
        """Create the token Secret (a fresh token; an existing one is kept: running pods use it) and apply the
        NetworkPolicy. False where the API server serves no Secrets (nothing is created there)."""
        if not self.secrets_served():
            return False
        data = self._read(owner)
        if data is None:
            secret = render_auth_secret(owner, self.namespace, profile, secrets.token_hex(32))
            self.kube.call(
                f"create Secret {self.namespace}/{auth_secret_name(owner)}", self.kube.core.create_namespaced_secret,
                self.namespace, secret,
            )
        elif not data.get(AUTH_SECRET_KEY):  # made before authOptions: the same token under KubeRay's key
            token = data.get(LEGACY_AUTH_SECRET_KEY) or secrets.token_hex(32)
            self.kube.call(
                f"patch Secret {self.namespace}/{auth_secret_name(owner)}", self.kube.core.patch_namespaced_secret,
                auth_secret_name(owner), self.namespace,
                {"stringData": {AUTH_SECRET_KEY: token}},
                _content_type="application/merge-patch+json",
            )
        for policy in security_manifests(owner, self.namespace, profile):
            self.kube.call(
                f"apply NetworkPolicy {self.namespace}/{policy['metadata']['name']}",
                self.networking.patch_namespaced_network_policy, policy["metadata"]["name"], self.namespace, policy,
                field_manager=FIELD_MANAGER, force=True, _content_type=APPLY,
            )
        return True

    def adopt(self, owner: str, obj: dict[str, Any]) -> None:
        """Make the RayCluster/RayJob ``obj`` own the Secret and NetworkPolicy: Kubernetes deletes them with it."""
        meta = obj.get("metadata") or {}
        if not meta.get("uid"):
            return
        ref = {"apiVersion": obj.get("apiVersion", "ray.io/v1"), "kind": obj.get("kind"), "name": meta.get("name"),
               "uid": meta["uid"]}
        patch = {"metadata": {"ownerReferences": [ref]}}
        calls = [(f"Secret {auth_secret_name(owner)}", self.kube.core.patch_namespaced_secret, auth_secret_name(owner)),
                 (f"NetworkPolicy {network_policy_name(owner)}", self.networking.patch_namespaced_network_policy,
                  network_policy_name(owner))]
        for what, fn, name in calls:
            try:
                self.kube.call(f"patch {what}", fn, name, self.namespace, patch,
                               _content_type="application/merge-patch+json")
            except NotFound:
                pass

    def delete(self, owner: str) -> None:
        calls = [(self.kube.core.delete_namespaced_secret, auth_secret_name(owner)),
                 (self.networking.delete_namespaced_network_policy, network_policy_name(owner))]
        for fn, name in calls:
            try:
                self.kube.call(f"delete {name}", fn, name, self.namespace)
            except NotFound:
                pass
