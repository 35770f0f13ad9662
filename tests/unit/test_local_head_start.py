"""`cluster up` tries Ray's head once more when `ray start` gave up on its raylet within Ray's fixed 30 s (a
loaded machine), and refuses with the reason when that happens again."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain.clusters import local_head, ray_process
from raytrain.errors import ClusterError
from tests.conftest import free_port


def test_the_words_raytrain_looks_for_are_those_of_the_installed_ray():
    node_py = Path(importlib.util.find_spec("ray").submodule_search_locations[0]) / "_private" / "node.py"
    source = node_py.read_text()
    assert local_head.RAYLET_LATE in source and "raylet_start_wait_time_s = 30" in source


def test_a_late_raylet_is_tried_once_more_then_refused_with_its_reason(raytrain_home, monkeypatch, capsys):
    # Ray's raylet late past Ray's 30 s needs a loaded machine: stand-ins for `ray start` exit with its words
    spawned = []

    def late_ray_start(args, *, token_path, log_path, extra_env=None):
        spawned.append(args)
        with open(log_path, "wb") as log:
            return subprocess.Popen([sys.executable, "-c", "import sys; print('Exception: The current node timed out "
                                     "during startup. This could happen because some of the raylet failed to startup "
                                     "or the GCS has become overloaded.'); sys.exit(1)"], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    monkeypatch.setattr(ray_process, "spawn", late_ray_start)
    port = free_port()
    dashboard = free_port(avoid={port})
    with pytest.raises(ClusterError) as err:
        local_head.up(port=port, dashboard_port=dashboard, timeout_s=100)
    assert len(spawned) == 2
    assert "Ray's raylet did not register within Ray's fixed 30 s" in str(err.value)
    assert "(tried 2 time(s) within 100 s)" in str(err.value)
    assert capsys.readouterr().err.count("starting it once more") == 1
    assert local_head.current() is None  # nothing recorded as running

    spawned.clear()  # not when what is left of the bound is shorter than Ray's own wait
    with pytest.raises(ClusterError, match=r"tried 1 time\(s\) within 20 s"):
        local_head.up(port=port, dashboard_port=dashboard, timeout_s=20)
    assert len(spawned) == 1


def test_the_ports_derived_from_the_dashboards_never_equal_a_port_given(tmp_path):
    # CI drew --port 53129 and --dashboard-port 59029: the agent's derived port was 53129 too, and Ray refused
    ports = local_head._ports_of(local_head._head_command(53129, 59029, tmp_path))
    assert ports["--port"] == 53129 and ports["--dashboard-port"] == 59029
    assert len(set(ports.values())) == 4 and ports["--dashboard-agent-listen-port"] == 53130, ports
    ports = local_head._ports_of(local_head._head_command(20001, 38265, tmp_path))
    assert ports["--ray-client-server-port"] == 20002 and len(set(ports.values())) == 4, ports
