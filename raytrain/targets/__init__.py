"""Where a plan runs. ``make_target`` picks one from --address / $RAYTRAIN_ADDRESS, else the local cluster."""
from __future__ import annotations

import os

from raytrain.targets.base import JobHandle, Request, Target


def make_target(address: str | None = None, *, auto_start: bool = True) -> Target:
    address = address or os.environ.get("RAYTRAIN_ADDRESS")
    if address and address not in ("local", "auto"):
        from raytrain.targets.ray_jobs import RayJobsTarget

        return RayJobsTarget(address)
    from raytrain.targets.local import LocalTarget

    return LocalTarget(auto_start=auto_start)


__all__ = ["JobHandle", "Request", "Target", "make_target"]
