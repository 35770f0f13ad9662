"""The local head raytrain starts: the quiet settings (periods of what an idle head does), Ray's defaults
back under RAYTRAIN_RAY_TUNING=off (bench/idle_cluster.py measures both)."""
from raytrain.clusters import ray_process


def test_quiet_env_slows_what_an_idle_head_polls(monkeypatch):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    env = ray_process.quiet_env()
    assert env["RAY_worker_niceness"] == "0"  # the node's own workers are not niced under its head
    assert env["RAY_enable_metrics_collection"] == "0"
    assert float(env["LOG_NAME_UPDATE_INTERVAL_S"]) > 0.5  # Ray's default glob period
    assert float(env["RAY_memory_monitor_refresh_ms"]) > 250
    for key, value in env.items():
        assert value.replace(".", "", 1).isdigit(), (key, value)  # Ray parses them as numbers
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert ray_process.quiet_env() == {}


def spawned_env(monkeypatch, tmp_path) -> dict:
    """The environment ``ray_process.spawn`` gives ``ray start`` (nothing is started)."""
    seen = {}

    class Popen:
        def __init__(self, args, env, **kwargs):
            seen.update(env)
            self.pid = 0

    monkeypatch.setattr(ray_process.subprocess, "Popen", Popen)
    ray_process.spawn(["start"], token_path=tmp_path / "t", log_path=tmp_path / "log")
    return seen


def test_environment_wins_over_the_quiet_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    monkeypatch.setenv("LOG_NAME_UPDATE_INTERVAL_S", "0.5")
    seen = spawned_env(monkeypatch, tmp_path)
    assert seen["LOG_NAME_UPDATE_INTERVAL_S"] == "0.5"
    assert seen["RAY_memory_monitor_refresh_ms"] == ray_process.QUIET_ENV["RAY_memory_monitor_refresh_ms"]


def test_the_log_monitor_globs_for_new_files_at_the_quiet_period(monkeypatch):
    """Ray's log monitor honours LOG_NAME_UPDATE_INTERVAL_S only above RAY_LOG_MONITOR_MANY_FILES_THRESHOLD
    files; below it globs on every 0.1 s poll. Checked against the installed Ray: with the quiet settings a
    monitor following a few files looks for new ones only once the interval has passed."""
    import os
    import subprocess
    import sys

    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    probe = (
        "import sys, time, types\n"
        "from ray._private import log_monitor as lm\n"
        "me = types.SimpleNamespace(log_filenames={'a.log', 'b.log'})\n"
        "now = time.time()\n"
        "print(lm.LogMonitor.should_update_filenames(me, now), lm.LogMonitor.should_update_filenames(me, now - 3))\n"
    )
    for env, expected in ((ray_process.quiet_env(), "False True"), ({}, "True True")):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **env}, check=True).stdout.split()
        assert " ".join(out) == expected, (env.get("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"), out)


def test_the_dashboards_modules_get_longer_than_rays_30_s_to_start_unless_the_environment_says(monkeypatch, tmp_path):
    """Ray 2.58's dashboard exited when a module process took over 30 s to start on a loaded machine, and
    `ray start --head` failed with it: tunings on or off, the head gets START_ENV's bound."""
    key = "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"
    monkeypatch.delenv(key, raising=False)
    for tuning in ("on", "off"):
        monkeypatch.setenv("RAYTRAIN_RAY_TUNING", tuning)
        seen = spawned_env(monkeypatch, tmp_path)
        assert float(seen[key]) >= 120, seen.get(key)
    monkeypatch.setenv(key, "45")
    assert spawned_env(monkeypatch, tmp_path)[key] == "45"
    from raytrain.clusters.local_head import START_TIMEOUT_S

    assert float(ray_process.START_ENV[key]) < START_TIMEOUT_S  # raytrain's own wait for the head still bounds it
