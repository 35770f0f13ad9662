"""The head's process raytrain runs through a module of its own (raytrain.ray_tuning.ray_dashboard): which commands are rewritten, and that what they change still exists in the installed Ray
(a Ray upgrade that moved it must fail here, not leave the head silently on Ray's polls or broken)."""
from __future__ import annotations

import asyncio
import inspect
import os
import time

from raytrain.ray_tuning import ray_dashboard
from raytrain.ray_tuning.ray_start import QUIET_SCRIPTS, head_command, via_module

PY = ["/venv/bin/python", "-u"]
DASHBOARD = os.path.join("/venv", "ray", "dashboard", "dashboard.py")
LOG_MONITOR = os.path.join("/venv", "ray", "_private", "log_monitor.py")


def test_the_dashboard_runs_through_raytrains_module_and_the_log_monitor_as_ray_starts_it():
    cmd = [*PY, DASHBOARD, "--port=8265"]
    assert head_command(cmd, "dashboard", ("JobHead",), True) == [
        *PY, "-m", "raytrain.ray_tuning.ray_dashboard", "--port=8265", "--modules-to-load=JobHead"]
    lm = [*PY, LOG_MONITOR, "--session-dir=/tmp/s"]
    assert head_command(lm, "log_monitor", None, True) == lm  # no patching of Ray's log monitor
    # Ray's own polls (tuning off): the scripts as Ray starts them
    assert head_command(cmd, "dashboard", None, False) == cmd and head_command(lm, "log_monitor", None, False) == lm
    raylet = ["/venv/ray/core/src/ray/raylet/raylet", "--node-ip-address=127.0.0.1"]
    assert head_command(raylet, "raylet", ("JobHead",), True) == raylet
    # the table is keyed by Ray's own process types
    from ray._private import ray_constants

    assert set(QUIET_SCRIPTS) == {ray_constants.PROCESS_TYPE_DASHBOARD}
    # a command without the script (Ray changed how it starts it) is left as it is
    assert via_module(["python", "other.py"], "dashboard.py", "m") == ["python", "other.py"]


def test_the_scripts_raytrain_runs_exist_where_it_looks_for_them():
    assert os.path.isfile(ray_dashboard.dashboard_script())


def test_each_dashboard_poll_is_the_only_one_second_sleep_of_its_ray_module():
    """ray_dashboard stretches every ``asyncio.sleep(1)`` of two Ray modules: each must have exactly one,
    in the poll it means to slow (the dashboard's health check of a module; a module's check of its parent)."""
    from ray.dashboard.subprocesses import handle, module

    for mod, method in ((handle, handle.SubprocessModuleHandle._do_periodic_health_check),
                        (module, module.SubprocessModule._detect_parent_process_death)):
        assert inspect.getsource(mod).count("asyncio.sleep(") == 1 and "asyncio.sleep(1)" in inspect.getsource(method)
    assert hasattr(handle.SubprocessModuleHandle, "preload_in_forkserver")


def test_a_stretched_asyncio_changes_only_the_one_second_sleep():
    mod = ray_dashboard.stretched_asyncio(0.05)
    assert mod.gather is asyncio.gather and mod.Event is asyncio.Event

    async def timed(delay):
        t0 = time.monotonic()
        assert await mod.sleep(delay, "r") == "r"
        return time.monotonic() - t0

    assert 0.04 <= asyncio.run(timed(1)) < 0.5  # the poll: 0.05 s here
    assert asyncio.run(timed(0)) < 0.04  # any other sleep as asked


def test_the_dashboard_patch_reaches_the_module_processes_through_the_forkserver(monkeypatch):
    """The dashboard adds raytrain's module to what the forkserver imports before forking each module process;
    importing it there slows the module's parent check."""
    from multiprocessing import forkserver

    from ray.dashboard.subprocesses import handle, module

    monkeypatch.setattr(handle, "asyncio", handle.asyncio)
    monkeypatch.setattr(module, "asyncio", module.asyncio)
    monkeypatch.setattr(handle.SubprocessModuleHandle, "preload_in_forkserver",
                        handle.SubprocessModuleHandle.__dict__["preload_in_forkserver"])
    monkeypatch.setattr(forkserver._forkserver, "_preload_modules", list(forkserver._forkserver._preload_modules))
    ray_dashboard.slow_health_checks()
    ray_dashboard.slow_module_parent_check()
    assert handle.asyncio is not asyncio and module.asyncio is not asyncio
    handle.SubprocessModuleHandle.preload_in_forkserver([module.SubprocessModule])
    assert forkserver._forkserver._preload_modules[-1] == "raytrain.ray_tuning.ray_dashboard"
    assert "ray" in forkserver._forkserver._preload_modules
