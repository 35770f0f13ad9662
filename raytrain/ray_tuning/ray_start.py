"""``ray start`` as raytrain runs it: Ray's own command line, with the dashboard loading only the modules a
raytrain-run node uses.

    python -m raytrain.ray_tuning.ray_start start --head --block ...      # what `ray start ...` would do

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

The dashboard is started through raytrain's ``ray_dashboard`` (Ray's script, with its hard-coded
module health check made slower; see there).

Every worker process starts through raytrain's ``ray_setup_worker`` (Ray's ``setup_worker.py`` without
importing Ray; see there). The raylet may start at least ``MIN_STARTUP_CONCURRENCY`` worker processes at once (Ray allows as many as
the node has CPUs: 2 on a 2-CPU node, where a job's start asks for its Train controller, the controller's
synchronisation actor and a process per worker at the same moment; see raytrain.runtime.prestart).
Nor does the raylet start Ray's one idle process per CPU for the node's first job, with an empty
runtime env that no raytrain actor has.

Tunings (raytrain.ray_tuning): ``dashboard_modules``, ``quiet_dashboard``, ``raylet_flags``,
``light_setup_worker``, ``no_ray_client``; each one off on a Ray it was not written for. With
``RAYTRAIN_RAY_TUNING=off`` (stock Ray) every module loads, the client server starts, Ray's scripts run as
they are and the raylet starts as many workers at once as Ray allows, and its idle ones for the first job.
"""
from __future__ import annotations

import os
import sys

from raytrain import ray_tuning

DASHBOARD_MODULES = ("JobHead", "StateHead", "NodeHead", "ReportHead", "EventHead", "UsageStatsHead")


def modules_to_load(env: dict[str, str] | None = None) -> tuple[str, ...] | None:
    """The dashboard modules to load; None: all of them (Ray's default)."""
    return DASHBOARD_MODULES if ray_tuning.on("dashboard_modules", env) else None


def dashboard_command(command: list[str], modules: tuple[str, ...] | None) -> list[str]:
    """The dashboard's command line with ``--modules-to-load``, unless Ray set one or all modules are wanted."""
    if modules is None or any(str(c).startswith("--modules-to-load") for c in command):
        return list(command)
    return [*command, "--modules-to-load=" + ",".join(modules)]


# The head's Python processes that raytrain runs through a module of its own (each docstring says what
# changes): Ray's process type -> (the script file in Ray's command line, the module that runs it instead).
QUIET_SCRIPTS = {
    "dashboard": ("dashboard.py", "raytrain.ray_tuning.ray_dashboard"),  # ray_constants.PROCESS_TYPE_DASHBOARD
}


def via_module(command: list[str], script: str, module: str) -> list[str]:
    """``[python, -u, .../SCRIPT, args...]`` -> ``[python, -u, -m, MODULE, args...]`` (unchanged if no such script)."""
    for i, part in enumerate(command):
        if str(part).endswith(os.sep + script):
            return [*command[:i], "-m", module, *command[i + 1:]]
    return list(command)


MIN_STARTUP_CONCURRENCY = 4
STARTUP_FLAG = "--maximum_startup_concurrency="


def startup_concurrency(env: dict[str, str] | None = None) -> int:
    """The floor for the raylet's ``--maximum_startup_concurrency`` (0: leave Ray's value)."""
    return MIN_STARTUP_CONCURRENCY if ray_tuning.on("raylet_flags", env) else 0


WORKER_COMMAND_FLAG = "--python_worker_command="
RAY_SETUP_WORKER = os.path.join("_private", "workers", "setup_worker.py")


def light_setup_worker(env: dict[str, str] | None = None) -> bool:
    """Whether workers start through raytrain's setup step (else Ray's)."""
    return ray_tuning.on("light_setup_worker", env)


def python_worker_command(value: str, setup_worker: str) -> str:
    """The raylet's ``--python_worker_command`` value with Ray's setup_worker.py replaced by ``setup_worker``
    (unchanged unless Ray's script is in it exactly once and neither path needs quoting)."""
    parts = value.split(" ")
    hits = [i for i, p in enumerate(parts) if p.endswith(os.sep + RAY_SETUP_WORKER)]
    if len(hits) != 1 or any(c in setup_worker for c in " \t\"'"):
        return value
    parts[hits[0]] = setup_worker
    return " ".join(parts)


PRESTART_FLAG = "--num_prestart_python_workers="


def raylet_command(command: list[str], floor: int, setup_worker: str | None = None,
                   no_idle_workers: bool = False) -> list[str]:
    """The raylet's command line with ``--maximum_startup_concurrency`` at least ``floor``; given
    ``setup_worker``, its workers started through that script; with ``no_idle_workers``, none started for the
    node's first job with an empty runtime env (``--num_prestart_python_workers``: one per CPU, which no
    raytrain job can use: its actors all have env vars; raytrain.runtime.prestart starts the processes a job
    will use)."""
    out = []
    for part in command:
        text = str(part)
        if floor and text.startswith(STARTUP_FLAG) and text[len(STARTUP_FLAG):].isdigit():
            part = STARTUP_FLAG + str(max(int(text[len(STARTUP_FLAG):]), floor))
        elif no_idle_workers and text.startswith(PRESTART_FLAG):
            part = PRESTART_FLAG + "0"
        elif setup_worker and text.startswith(WORKER_COMMAND_FLAG):
            part = WORKER_COMMAND_FLAG + python_worker_command(text[len(WORKER_COMMAND_FLAG):], setup_worker)
        out.append(part)
    return out


def head_command(command: list[str], process_type: str, modules: tuple[str, ...] | None, quiet_polls: bool,
                 min_startup: int = 0, setup_worker: str | None = None) -> list[str]:
    """How raytrain starts one of the node's processes, given Ray's command line for it (``quiet_polls``:
    the dashboard through raytrain's module; ``min_startup``: also no idle workers for the first job)."""
    from ray._private import ray_constants

    if process_type == ray_constants.PROCESS_TYPE_DASHBOARD:
        command = dashboard_command(command, modules)
    if process_type == ray_constants.PROCESS_TYPE_RAYLET and (min_startup or setup_worker):
        command = raylet_command(command, min_startup, setup_worker, no_idle_workers=bool(min_startup))
    if quiet_polls and process_type in QUIET_SCRIPTS:
        command = via_module(command, *QUIET_SCRIPTS[process_type])
    return command


def start_head_processes_quietly(modules: tuple[str, ...] | None, quiet_polls: bool, min_startup: int = 0,
                                 setup_worker: str | None = None) -> None:
    """Make Ray start its dashboard with only ``modules``, its raylet with a startup concurrency of at least
    ``min_startup`` and its workers through ``setup_worker`` and, with ``quiet_polls``, the dashboard
    through raytrain's module (Ray builds each command in ``services.start_*`` and starts it
    with ``services.start_ray_process``)."""
    if modules is None and not quiet_polls and not min_startup and not setup_worker:
        return
    from ray._private import services

    start = services.start_ray_process

    def start_ray_process(command, process_type, *args, **kwargs):
        command = head_command(command, process_type, modules, quiet_polls, min_startup, setup_worker)
        return start(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


def ray_client_wanted(env: dict[str, str] | None = None) -> bool:
    return not ray_tuning.on("no_ray_client", env)


def skip_ray_client_server() -> None:
    """The head starts no Ray Client server (``Node.start_ray_client_server`` does nothing)."""
    from ray._private.node import Node

    Node.start_ray_client_server = lambda self: None


def main() -> None:
    from raytrain.ray_tuning import ray_setup_worker

    setup_worker = ray_setup_worker.__file__ if light_setup_worker() else None
    start_head_processes_quietly(modules_to_load(), ray_tuning.on("quiet_dashboard"), startup_concurrency(),
                                 setup_worker)
    if not ray_client_wanted():
        skip_ray_client_server()
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    sys.exit(ray_main())


if __name__ == "__main__":
    main()
