"""Kubernetes and KubeRay object names: what the API server and KubeRay accept, checked before any call. Pure."""
from __future__ import annotations

import re
from typing import Any

from raytrain.errors import ConfigError

# KubeRay's own limits: a RayCluster's service names get suffixes ("-serve-svc"), a RayJob's cluster 6 more.
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_name(kind: str, name: Any, *, flag: str, what: str | None = None) -> str:
    """A valid KubeRay object name (DNS-1035 label, KubeRay's length limit), else a one-line ConfigError."""
    limit = MAX_NAME[kind]
    label = what or f"{flag} {name!r}"
    if not isinstance(name, str) or not _DNS1035.match(name) or len(name) > limit:
        raise ConfigError(
            f"{label}: invalid {kind} name; use 1-{limit} lowercase letters, digits or '-', "
            "starting with a letter and ending with a letter or digit",
            flag=flag,
        )
    return name


def check_namespace(namespace: Any, *, flag: str = "--namespace", what: str | None = None) -> str:
    label = what or f"{flag} {namespace!r}"
    if not isinstance(namespace, str) or not _DNS1123.match(namespace) or len(namespace) > 63:
        raise ConfigError(
            f"{label}: invalid namespace; use 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit",
            flag=flag,
        )
    return namespace
