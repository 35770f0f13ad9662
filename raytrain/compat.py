"""Which Ray, Python, torch and DeepSpeed a cluster must run for raytrain's runtime, and the refusal of one it
cannot run on.

raytrain's driver and workers run in the cluster's Python with the cluster's Ray, torch and DeepSpeed (on
`--address` and Kubernetes targets raytrain ships its own package, nothing else). Each component has a range:
from the oldest release the runtime runs on to the newest one tested (pyproject.toml pins the same ranges for
this machine). Older than the range, or missing: refused before anything is submitted. Newer than the tested
range within the same major release: accepted with one warning line (the next Ray minor release has to work
the day it ships; version-gated code turns itself off on a release it was not written for).
"""
from __future__ import annotations

import re

# [first, last] Ray minor releases the runtime is tested with (pyproject.toml pins the same range)
RAY_MINORS = ((2, 58), (2, 60))
# component -> (oldest it runs on, newest tested), as (major, minor)
NEEDS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "ray": RAY_MINORS,
    "python": ((3, 10), (3, 11)),
    "torch": ((2, 4), (2, 15)),
    # 0.18 on any torch in range: with the fixes in runtime/worker/deepspeed_compat.py (its ZeRO-1/2 step
    # fails on CPU workers without them)
    "deepspeed": ((0, 18), (0, 19)),
}
LABELS = {"ray": "Ray", "python": "Python", "torch": "torch", "deepspeed": "DeepSpeed"}


def _minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _span(component: str) -> str:
    (a, b), (c, d) = NEEDS[component]
    return f"{a}.{b}.x" if (a, b) == (c, d) else f"{a}.{b}.x to {c}.{d}.x"


def supported_ray() -> str:
    return _span("ray")


def supported(component: str) -> str:
    return _span(component)


def fit(component: str, version: str | None) -> str:
    """'ok', 'newer' (past the newest tested, same major: runs, untested), or 'refused'."""
    minor = _minor(version)
    if minor is None:
        return "refused"
    oldest, newest = NEEDS[component]
    if oldest <= minor <= newest:
        return "ok"
    if minor > newest and minor[0] == newest[0]:
        return "newer"
    return "refused"


def version_problem(component: str, cluster: str | None, where: str, local: str | None = None) -> str | None:
    """One line saying why raytrain cannot run on ``component`` ``cluster`` at ``where`` (None: it can).
    ``local``: this machine's version, named too so the user sees both."""
    if fit(component, cluster) != "refused":
        return None
    name, span = LABELS[component], _span(component)
    here = f" (this machine has {local})" if local else ""
    if cluster:
        found = f"runs {name} {cluster}"
    else:
        found = "runs Ray of an unknown version" if component == "ray" else f"has no {name}"
    if component == "ray":
        todo = f"submit to a cluster with Ray {span}, or use a raytrain release that supports Ray {cluster}"
    elif component == "python":
        todo = f"use a cluster image with Python {span}"
    else:
        todo = f"install {name} {span} in the cluster's image (pip install '{component}>={NEEDS[component][0][0]}" \
               f".{NEEDS[component][0][1]}')"
    return f"the cluster at {where} {found}; raytrain's runtime needs {name} {span}{here}: {todo}"


def version_warning(component: str, cluster: str | None, where: str) -> str | None:
    """One line for a version newer than the newest tested (it runs, untested); None otherwise."""
    if fit(component, cluster) != "newer":
        return None
    return (f"the cluster at {where} runs {LABELS[component]} {cluster}, newer than raytrain is tested with "
            f"({_span(component)}): submitting anyway")


def ray_version_problem(cluster: str, where: str, local: str | None = None) -> str | None:
    return version_problem("ray", cluster, where, local)


def check_versions(cluster: dict[str, str | None], where: str,
                   local: dict[str, str | None] | None = None) -> tuple[str | None, list[str]]:
    """(the refusal, one line or None; the warnings) for a cluster reporting ``cluster`` (component ->
    version, None: not installed). Components it does not report are not judged."""
    local = local or {}
    problems, refused, warnings = [], [], []
    for component in NEEDS:
        if component not in cluster:
            continue
        problem = version_problem(component, cluster[component], where, local.get(component))
        if problem:
            problems.append(problem)
            refused.append(f"{LABELS[component]} {_span(component)}")
        warning = version_warning(component, cluster[component], where)
        if warning:
            warnings.append(warning)
    if not problems:
        return None, warnings
    first = problems[0]
    if len(problems) > 1:  # still one line: the first in full, the others by what they need
        first += f" (it also needs {', '.join(refused[1:])})"
    return first, warnings


def local_ray_version() -> str | None:
    """This machine's Ray (from its package metadata: importing Ray costs seconds)."""
    return local_versions()["ray"]


def local_versions() -> dict[str, str | None]:
    """This machine's Ray, Python, torch and DeepSpeed, from package metadata (nothing imported)."""
    import platform
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for component in ("ray", "torch", "deepspeed"):
        try:
            out[component] = metadata.version(component)
        except metadata.PackageNotFoundError:
            out[component] = None
    return out


# What the cluster runs: a Ray job whose entrypoint is this (no upload, nothing imported but the standard
# library), printing one marked line.
PROBE_MARK = "@@raytrain-versions "
PROBE_CODE = (
    "import json, platform\n"
    "from importlib import metadata\n"
    "out = {'python': platform.python_version()}\n"
    "for name in ('ray', 'torch', 'deepspeed'):\n"
    "    try:\n"
    "        out[name] = metadata.version(name)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        out[name] = None\n"
    f"print({PROBE_MARK!r} + json.dumps(out), flush=True)\n"
)


def parse_probe(log: str) -> dict[str, str | None] | None:
    import json

    for line in (log or "").splitlines():
        if line.startswith(PROBE_MARK):
            try:
                data = json.loads(line[len(PROBE_MARK):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None
