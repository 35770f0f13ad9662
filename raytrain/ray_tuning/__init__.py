"""raytrain's Ray tunings: every use of a Ray private module, private method or Ray internal, in one package.

Each tuning changes how stock Ray runs (fewer processes, slower idle polls, work started ahead) and relies on
Ray internals that a Ray release may change. Each one is declared in :data:`TUNINGS` with the Ray minor
releases it was written and contract-tested for (``tests/unit/test_ray_tuning_contracts.py``); on any other
Ray it turns itself off, with one line on stderr naming it and why. ``RAYTRAIN_RAY_TUNING=off`` turns them
all off: raytrain then runs on stock Ray through public APIs only (docs/ray-tuning.md).

Accesses that are not tunings but that raytrain needs (Ray Train's error logger, the job client's loggers,
Ray Data's block bundles) are here too (:mod:`raytrain.ray_tuning.ray_access`), each with a fallback. Nothing outside this package
imports ``ray._private`` or a ``_internal`` module; this package imports only raytrain's shared leaves
(settings, timings), never ``runtime/`` or ``clusters/``.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Mapping

from raytrain import settings

SWITCH = "RAYTRAIN_RAY_TUNING"


@dataclass(frozen=True)
class Tuning:
    name: str
    module: str  # the module of raytrain.ray_tuning that holds it
    ray: tuple[str, ...]  # the Ray minor releases ("2.60") it was written and contract-tested for
    what: str  # one line: what it changes


# Where the CLI, the local head and the job read the version: one written against 2.60's internals
TESTED_RAY = ("2.60",)

TUNINGS: dict[str, Tuning] = {t.name: t for t in [
    Tuning("dashboard_modules", "ray_start", TESTED_RAY, "the local head's dashboard loads only the API modules "
           "raytrain uses"),
    Tuning("no_ray_client", "ray_start", TESTED_RAY, "the local head starts no Ray Client server"),
    Tuning("raylet_flags", "ray_start", TESTED_RAY, "the local raylet starts at least 4 worker processes at once "
           "and no idle ones for the first job"),
    Tuning("light_setup_worker", "ray_setup_worker", TESTED_RAY, "worker processes start through a setup step "
           "that does not import Ray"),
    Tuning("quiet_dashboard", "ray_dashboard", TESTED_RAY, "the dashboard health-checks its modules every 10 s, "
           "not every second"),
    Tuning("prestart", "prestart", TESTED_RAY, "the driver has the raylet start the job's controller and worker "
           "processes ahead"),
    Tuning("prompt_poll", "prompt_poll", TESTED_RAY, "Ray Train's controller polls the workers every 2 s and at "
           "once when one asks"),
    Tuning("early_imports", "early_imports", TESTED_RAY, "workers import torch and DeepSpeed in the background "
           "from the moment they start"),
    Tuning("lazy_torch", "lazy_torch", TESTED_RAY, "the driver and the controller do not import torch (a "
           "torch-free process-group backend)"),
    Tuning("lean_trainer", "lean_trainer", TESTED_RAY, "Ray Train's trainer without the callbacks and "
           "coordinator calls a raytrain run does not use"),
    Tuning("elastic_fresh_view", "elastic_view", TESTED_RAY, "an elastic run sizes each start and restart by "
           "the cluster's nodes now, not as Ray's coordinator saw them up to 20 s before"),
    Tuning("report_barrier", "ray_access", TESTED_RAY, "a worker's checkpoint report returns once the "
           "controller has it"),
]}

_said: set[str] = set()


def switched_on(env: Mapping[str, str] | None = None) -> bool:
    """``RAYTRAIN_RAY_TUNING`` is not ``off``."""
    return settings.get(SWITCH, env) != "off"


def ray_version() -> str:
    """The installed Ray's version, from its package metadata (no ``import ray``: the CLI never pays it)."""
    mod = sys.modules.get("ray")
    if mod is not None and getattr(mod, "__version__", None):
        return mod.__version__
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return ""


def minor(version: str) -> str | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def off_reason(name: str, env: Mapping[str, str] | None = None, version: str | None = None) -> str | None:
    """Why tuning ``name`` is off here (None: it is on)."""
    tuning = TUNINGS[name]
    if not switched_on(env):
        return f"{SWITCH}=off"
    version = ray_version() if version is None else version
    if minor(version) not in tuning.ray:
        written = ", ".join(v + ".x" for v in tuning.ray)
        return f"written for Ray {written}, this is Ray {version or 'of an unknown version'}"
    return None


def on(name: str, env: Mapping[str, str] | None = None, *, say: bool = True) -> bool:
    """Whether tuning ``name`` runs here. Off on a Ray it was not written for, saying so once per process on
    stderr (``say=False``: silently, for the workers' side of a tuning the driver or the head decided and
    announced); off without a word under ``RAYTRAIN_RAY_TUNING=off`` (what the user asked for)."""
    reason = off_reason(name, env)
    if reason is None:
        return True
    if say and switched_on(env) and name not in _said:
        _said.add(name)
        print(f"raytrain: Ray tuning {name} is off: {reason} (stock Ray's behaviour; docs/ray-tuning.md)",
              file=sys.stderr, flush=True)
    return False
