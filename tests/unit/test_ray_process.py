"""`cluster up --node-ip/--resources` and `cluster join`: the checks made before anything starts."""
import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.errors import ConfigError
from raytrain.clusters import ray_process


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_parse_resources():
    assert ray_process.parse_resources(None) is None
    assert ray_process.parse_resources('{"node_a": 1, "ssd": 0.5}') == {"node_a": 1, "ssd": 0.5}
    for bad, words in [
        ("{x", "not JSON"), ("[1]", "JSON object"), ('{"CPU": 2}', "--num-cpus"), ('{"a": -1}', ">= 0"),
        ('{"a": "1"}', ">= 0"), ('{"a": true}', ">= 0"),
    ]:
        with pytest.raises(ConfigError, match=words):
            ray_process.parse_resources(bad)


def test_check_node_ip():
    assert ray_process.check_node_ip(None) is None
    assert ray_process.check_node_ip("127.0.0.1") == "127.0.0.1"
    with pytest.raises(ConfigError, match="not an IP address"):
        ray_process.check_node_ip("my-host")
    with pytest.raises(ConfigError, match="not an address of this machine"):
        ray_process.check_node_ip("203.0.113.77")


def test_start_flags():
    assert ray_process.start_flags(1, None, "10.0.0.1", {"a": 1}) == [
        "--num-cpus=1", "--node-ip-address=10.0.0.1", '--resources={"a": 1}',
    ]
    assert ray_process.start_flags(None, None, None, None) == []


def test_up_and_join_refuse_bad_flags_before_starting_anything(raytrain_home, tmp_path):
    r = run("cluster", "up", "--resources", "{oops")
    assert r.exit_code == 2 and "--resources" in r.output and "not JSON" in r.output
    r = run("cluster", "up", "--node-ip", "203.0.113.77")
    assert r.exit_code == 2 and "not an address of this machine" in r.output
    r = run("cluster", "join", "10.0.0.1:6379", "--token-file", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "--token-file" in r.output
    token = tmp_path / "token"
    token.write_text("abc")
    r = run("cluster", "join", "no-port", "--token-file", str(token))
    assert r.exit_code == 2 and "HOST:PORT" in r.output
    r = run("cluster", "join", "10.0.0.1:6379", "--token-file", str(token), "--num-cpus", "-1")
    assert r.exit_code == 2 and ">= 0" in r.output
    assert not (raytrain_home / "cluster.json").exists() and not (raytrain_home / "node.json").exists()
    assert "no local Ray cluster is running" in run("cluster", "down").output


def test_down_never_stops_a_process_that_only_reuses_the_recorded_pid(raytrain_home):
    """After a reboot the record's pid may name another process: the start time tells them apart."""
    import json
    import subprocess

    from raytrain.clusters import local_head

    other = subprocess.Popen(["sleep", "120"])
    try:
        started = ray_process.started_at(other.pid)
        assert started is not None
        record = {"pid": other.pid, "dashboard_url": "http://127.0.0.1:1", "gcs_address": "127.0.0.1:2",
                  "temp_dir": str(raytrain_home / "tmp"), "token_path": "", "log_path": "", "started_at": 0.0}
        raytrain_home.mkdir(parents=True, exist_ok=True)
        path = raytrain_home / "cluster.json"
        path.write_text(json.dumps({**record, "pid_started": started}))
        assert local_head.current() is not None and local_head.current().process_alive()  # the same process
        path.write_text(json.dumps({**record, "pid_started": started - 3600}))  # the head that had this pid
        assert "no local Ray cluster is running" in run("cluster", "down").output
        assert other.poll() is None, "cluster down stopped a process that was not its head"
        assert not path.exists()  # the stale record is gone
    finally:
        other.kill()
        other.wait()


def test_a_failed_ray_start_leaves_nothing_of_its_session_running(tmp_path):
    """`ray start --head` that times out on a busy machine exits and leaves the processes it started (the
    dashboard agent holding a port) in its session: reap_group ends them so the next `cluster up` can bind."""
    import os
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    # A session leader (as spawn() starts `ray start`) that starts a long-lived child, then exits with an error.
    leader = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
         f"open({str(pid_file)!r}, 'w').write(str(p.pid)); sys.exit(1)"],
        start_new_session=True,
    )
    assert leader.wait(timeout=30) == 1
    child = int(pid_file.read_text())
    assert ray_process.pid_alive(child)  # what a failed `ray start` leaves behind
    ray_process.reap_group(leader.pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.waitpid(child, os.WNOHANG)[0]:  # not ours to reap: it was re-parented; poll below
                break
        except ChildProcessError:
            pass
        if not ray_process.pid_alive(child):
            break
        time.sleep(0.1)
    assert not ray_process.pid_alive(child)
    ray_process.reap_group(leader.pid)  # a session with nothing left: a no-op


def test_a_running_head_is_recognised_across_wall_clock_steps():
    """The start time is kept in seconds since boot, which a wall-clock step (NTP, a resumed VM) does not
    move; a record from before (a wall-clock start) is still recognised, allowing for such a step."""
    import subprocess

    from raytrain.timings import process_start_time

    other = subprocess.Popen(["sleep", "120"])
    try:
        since_boot = ray_process.started_at(other.pid)
        assert since_boot is not None and since_boot < 1e9
        assert ray_process.same_process(other.pid, since_boot)
        assert not ray_process.same_process(other.pid, since_boot - 1.0)
        wall = process_start_time(other.pid)
        assert ray_process.same_process(other.pid, wall + 40.0)  # a legacy record after a 40 s clock step
        assert not ray_process.same_process(other.pid, wall - 3600)
    finally:
        other.kill()
        other.wait()


# -- the dashboard modules raytrain's `ray start` loads ---------------------------------------------------------
def test_dashboard_modules_are_rays_and_leave_out_only_what_raytrain_never_calls():
    from ray.dashboard.subprocesses.module import SubprocessModule
    from ray.dashboard.utils import DashboardHeadModule, get_all_modules

    from raytrain.ray_tuning import ray_start

    available = {c.__name__ for kind in (DashboardHeadModule, SubprocessModule) for c in get_all_modules(kind)}
    chosen = set(ray_start.DASHBOARD_MODULES)
    # a name Ray does not have would make the dashboard refuse to start (it asserts what it loaded)
    assert chosen <= available, chosen - available
    # jobs (and /api/version), the state API, nodes, the reporter and events (the agents post theirs) stay
    assert {"JobHead", "StateHead", "NodeHead", "EventHead", "ReportHead"} <= chosen
    assert not chosen & {"ServeHead", "DataHead", "MetricsHead", "TrainHead"}


def test_dashboard_modules_follow_the_environment():
    from raytrain.ray_tuning.ray_start import DASHBOARD_MODULES, dashboard_command, modules_to_load

    assert modules_to_load({}) == DASHBOARD_MODULES
    assert modules_to_load({"RAYTRAIN_RAY_TUNING": "off"}) is None  # Ray's defaults throughout
    cmd = ["python", "dashboard.py", "--port=8265"]
    assert dashboard_command(cmd, ("JobHead", "StateHead")) == [*cmd, "--modules-to-load=JobHead,StateHead"]
    assert dashboard_command(cmd, None) == cmd
    ray_own = [*cmd, "--modules-to-load=UsageStatsHead"]  # Ray's, with the dashboard off: left as it is
    assert dashboard_command(ray_own, ("JobHead",)) == ray_own


def test_the_quiet_head_starts_no_ray_client_server_and_no_autoscaler_monitor(monkeypatch, tmp_path):
    from raytrain.clusters.local_head import _head_command
    from raytrain.ray_tuning.ray_start import ray_client_wanted

    monkeypatch.delenv("RAYTRAIN_RAY_TUNING", raising=False)
    assert "--no-monitor" in _head_command(6390, 8275, tmp_path)
    assert not ray_client_wanted({})
    assert ray_client_wanted({"RAYTRAIN_RAY_TUNING": "off"})
    monkeypatch.setenv("RAYTRAIN_RAY_TUNING", "off")  # Ray's defaults
    assert "--no-monitor" not in _head_command(6390, 8275, tmp_path)
