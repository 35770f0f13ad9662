"""Ray's dashboard as raytrain's local head runs it: ``python -m raytrain.ray_tuning.ray_dashboard ARGS`` does
what ``python .../ray/dashboard/dashboard.py ARGS`` does, with two of its one-second polls made slower.

Ray's dashboard runs each API module in a process of its own; every second the dashboard health-checks each
module over HTTP, and every module checks that the dashboard is still alive: two wake-ups a second per
module, on a node where nothing else happens (the module processes and the dashboard took half of an idle
head's CPU). Here the health check runs every ``HEALTH_CHECK_S`` (10 s) and the module's
parent check every ``PARENT_CHECK_S`` (5 s): a module that died is restarted up to 10 s
after, not 1 s, and a module whose dashboard died exits up to 5 s after it. Ray's code is unchanged
otherwise; each poll is the only ``asyncio.sleep`` of its Ray module, and only a one-second sleep is changed
(``tests/unit/test_ray_pollers.py`` checks this still holds for the installed Ray).

The module processes are forked from a multiprocessing forkserver that imports a list of modules first
(``SubprocessModuleHandle.preload_in_forkserver``); this module adds itself to that list, and importing it
changes the module-side poll, so each module process inherits it. Nothing else happens on import.
"""
from __future__ import annotations

import asyncio
import os
import runpy
import sys
import types


HEALTH_CHECK_S = 10.0
PARENT_CHECK_S = 5.0


def stretched_asyncio(seconds: float) -> types.ModuleType:
    """``asyncio`` as seen by one Ray module: ``sleep(1)`` sleeps ``seconds``, all else is asyncio's."""

    class Stretched(types.ModuleType):
        def __getattr__(self, name):
            return getattr(asyncio, name)

    async def sleep(delay, result=None):
        return await asyncio.sleep(seconds if delay == 1 else delay, result)

    mod = Stretched("asyncio")
    mod.sleep = sleep
    return mod


def slow_module_parent_check() -> None:
    """In a module process: check the dashboard is alive every PARENT_CHECK_S, not every second."""
    from ray.dashboard.subprocesses import module

    module.asyncio = stretched_asyncio(PARENT_CHECK_S)


def slow_health_checks() -> None:
    """In the dashboard: health-check each module every HEALTH_CHECK_S, and make every module process (forked
    from the forkserver, which imports this module first) check its parent less often."""
    from ray.dashboard.subprocesses import handle

    handle.asyncio = stretched_asyncio(HEALTH_CHECK_S)
    cls = handle.SubprocessModuleHandle
    if not hasattr(cls, "preload_in_forkserver"):  # Ray before 2.60: no forkserver preload, modules keep Ray's poll
        return
    preload = cls.preload_in_forkserver.__func__

    def preload_in_forkserver(klass, module_classes):
        preload(klass, module_classes)
        if klass.mp_context.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            names = list(getattr(forkserver._forkserver, "_preload_modules", None) or [])
            klass.mp_context.set_forkserver_preload([*names, __spec__.name if __spec__ else __name__])

    cls.preload_in_forkserver = classmethod(preload_in_forkserver)


def dashboard_script() -> str:
    import ray.dashboard

    return os.path.join(os.path.dirname(ray.dashboard.__file__), "dashboard.py")


def main() -> None:
    slow_health_checks()
    slow_module_parent_check()
    script = dashboard_script()
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
else:
    # Imported by the forkserver before it forks module processes: anything but an ImportError here would
    # kill the forkserver and every module with it, so a Ray that moved things keeps its own poll.
    try:
        slow_module_parent_check()
    except Exception:  # noqa: BLE001
        pass
