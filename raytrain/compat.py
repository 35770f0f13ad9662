"""Which Ray a cluster must run for raytrain's runtime, and the refusal of one it cannot run on.

raytrain's driver and workers run in the cluster's Ray (on `--address` and Kubernetes targets raytrain ships
its own package, not Ray), and the runtime is written against the Ray minor releases below.
"""
from __future__ import annotations

import re

# [first, last] Ray minor releases the runtime is tested with (pyproject.toml pins the same range)
RAY_MINORS = ((2, 60), (2, 60))


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def supported_ray() -> str:
    (a, b), (c, d) = RAY_MINORS
    return f"{a}.{b}.x" if (a, b) == (c, d) else f"{a}.{b}.x to {c}.{d}.x"


def ray_version_problem(cluster: str, where: str, local: str | None = None) -> str | None:
    """One line saying why raytrain cannot run on a cluster with Ray ``cluster`` at ``where`` (None: it can).
    ``local``: this machine's Ray, named too so the user sees both."""
    minor = _minor(cluster)
    if minor is not None and RAY_MINORS[0] <= minor <= RAY_MINORS[1]:
        return None
    here = f" (this machine has {local})" if local else ""
    return (f"the cluster at {where} runs Ray {cluster or 'of an unknown version'}; raytrain's runtime needs Ray "
            f"{supported_ray()}{here}: submit to a cluster with Ray {supported_ray()}, or use a raytrain release "
            f"that supports Ray {cluster}")


def local_ray_version() -> str | None:
    """This machine's Ray (from its package metadata: importing Ray costs seconds)."""
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None
