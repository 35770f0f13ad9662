"""``ray start`` as raytrain runs it: Ray's own command line, with the dashboard loading only the modules a
raytrain-run node uses.

    python -m raytrain.clusters.ray_start start --head --block ...      # what `ray start ...` would do

Ray's dashboard runs each of its nine API modules in a process of its own and health-checks every one
each second, whether or not anything ever calls it; ``ray start`` has no flag to choose them (it passes
``--modules-to-load`` to the dashboard only when the dashboard is off). Left out here: Serve's, Ray Data's
(it reads Prometheus, whose metrics collection raytrain's node turns off), the metrics module (Grafana and
Prometheus health) and Ray Train's (its runs page needs Train's state-tracking actor, which raytrain's runs
do not start: it only ever answers HTTP 500). Kept: jobs (submit, status, logs, stop, ``/api/version``),
the state API (actors, placement groups, logs), nodes, the reporter (the dashboard's per-node view, stack
traces and profiles) and events (the agents post theirs to it).

Nor does it start Ray Client's server (``ray://``, port 10001): raytrain talks to a cluster through the
dashboard's jobs API only, and ``ray start`` cannot leave the server out (its port must be 1024-65535).

The dashboard and the log monitor are started through raytrain's ``ray_dashboard`` and ``ray_log_monitor``
(Ray's scripts, each with a hard-coded poll made slower; see there).

``RAYTRAIN_DASHBOARD_MODULES``: ``all`` for Ray's full set, or a comma-separated list of module class
names. ``RAYTRAIN_RAY_CLIENT=1`` starts Ray Client's server. With ``RAYTRAIN_QUIET_HEAD=0`` (Ray's defaults
throughout) every module loads, the client server starts and Ray's scripts run as they are.
"""
from __future__ import annotations

import os
import sys

from raytrain.clusters.ray_process import quiet

DASHBOARD_MODULES = ("JobHead", "StateHead", "NodeHead", "ReportHead", "EventHead", "UsageStatsHead")


def modules_to_load(env: dict[str, str] | None = None) -> tuple[str, ...] | None:
    """The dashboard modules to load; None: all of them (Ray's default)."""
    env = os.environ if env is None else env
    if not quiet(env):
        return None
    chosen = env.get("RAYTRAIN_DASHBOARD_MODULES", "").strip()
    if chosen.lower() == "all":
        return None
    if chosen:
        return tuple(m.strip() for m in chosen.split(",") if m.strip())
    return DASHBOARD_MODULES


def dashboard_command(command: list[str], modules: tuple[str, ...] | None) -> list[str]:
    """The dashboard's command line with ``--modules-to-load``, unless Ray set one or all modules are wanted."""
    if modules is None or any(str(c).startswith("--modules-to-load") for c in command):
        return list(command)
    return [*command, "--modules-to-load=" + ",".join(modules)]


# The head's Python processes that raytrain runs through a module of its own (each docstring says what
# changes): Ray's process type -> (the script file in Ray's command line, the module that runs it instead).
QUIET_SCRIPTS = {
    "dashboard": ("dashboard.py", "raytrain.clusters.ray_dashboard"),  # ray_constants.PROCESS_TYPE_DASHBOARD
    "log_monitor": ("log_monitor.py", "raytrain.clusters.ray_log_monitor"),  # PROCESS_TYPE_LOG_MONITOR
}


def via_module(command: list[str], script: str, module: str) -> list[str]:
    """``[python, -u, .../SCRIPT, args...]`` -> ``[python, -u, -m, MODULE, args...]`` (unchanged if no such script)."""
    for i, part in enumerate(command):
        if str(part).endswith(os.sep + script):
            return [*command[:i], "-m", module, *command[i + 1:]]
    return list(command)


def head_command(command: list[str], process_type: str, modules: tuple[str, ...] | None, quiet_polls: bool) -> list[str]:
    """How raytrain starts one of the head's processes, given Ray's command line for it."""
    from ray._private import ray_constants

    if process_type == ray_constants.PROCESS_TYPE_DASHBOARD:
        command = dashboard_command(command, modules)
    if quiet_polls and process_type in QUIET_SCRIPTS:
        command = via_module(command, *QUIET_SCRIPTS[process_type])
    return command


def start_head_processes_quietly(modules: tuple[str, ...] | None, quiet_polls: bool) -> None:
    """Make Ray start its dashboard with only ``modules`` and, with ``quiet_polls``, the dashboard and the log
    monitor through raytrain's modules (Ray builds each command in ``services.start_*`` and starts it with
    ``services.start_ray_process``)."""
    if modules is None and not quiet_polls:
        return
    from ray._private import services

    start = services.start_ray_process

    def start_ray_process(command, process_type, *args, **kwargs):
        return start(head_command(command, process_type, modules, quiet_polls), process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


def ray_client_wanted(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return not quiet(env) or env.get("RAYTRAIN_RAY_CLIENT", "0") == "1"


def skip_ray_client_server() -> None:
    """The head starts no Ray Client server (``Node.start_ray_client_server`` does nothing)."""
    from ray._private.node import Node

    Node.start_ray_client_server = lambda self: None


def main() -> None:
    start_head_processes_quietly(modules_to_load(), quiet())
    if not ray_client_wanted():
        skip_ray_client_server()
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    sys.exit(ray_main())


if __name__ == "__main__":
    main()
