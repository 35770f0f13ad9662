"""Every worker process on a raytrain node starts through raytrain.ray_tuning.ray_setup_worker, Ray's
setup_worker.py without importing Ray: it must set the same variables and exec the same command as Ray's,
and hand anything it does not know to Ray's script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from raytrain.ray_tuning import ray_setup_worker as light
from raytrain.ray_tuning.ray_start import head_command, python_worker_command, raylet_command, startup_concurrency

REST = ["/venv/ray/_private/workers/default_worker.py", "--node-ip-address=127.0.0.1", "--arg=a b"]


def ray_exec(context: dict, rest: list[str], monkeypatch) -> tuple[list, dict]:
    """What Ray's own RuntimeEnvContext.exec_worker would exec (args of os.execvp) and set."""
    from ray._private.runtime_env import context as ray_context
    from ray.core.generated.common_pb2 import Language

    seen = {}
    monkeypatch.setattr(ray_context.os, "execvp", lambda file, args: seen.setdefault("exec", (file, args)))
    ray_context.RuntimeEnvContext.deserialize(json.dumps(context)).exec_worker(list(rest), Language.PYTHON)
    return seen["exec"], dict(os.environ)


@pytest.mark.parametrize("context", [
    {},
    {"env_vars": {"FOO": "x", "PYTHONPATH": "/job:${PYTHONPATH}", "GONE": "a${NO_SUCH_VAR_XYZ}b", "HOME2": "$HOME/x"}},
    {"command_prefix": ["cd", "/tmp", "&&"], "py_executable": "/other/python", "env_vars": {}},
    {"override_worker_entrypoint": "/elsewhere/default_worker.py", "java_jars": []},
])
def test_it_execs_what_rays_setup_worker_execs(context, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/base")
    before = dict(os.environ)
    expected, ray_env = ray_exec(context, REST, monkeypatch)
    for key in (context.get("env_vars") or {}):  # back to what Ray's script started from
        if key in before:
            monkeypatch.setenv(key, before[key])
        else:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(light.os, "execvp", lambda file, args: (_ for _ in ()).throw(SystemExit((file, args))))
    args = [*REST[:1], f"--serialized-runtime-env-context={json.dumps(context)}", *REST[1:], "--language=PYTHON"]
    with pytest.raises(SystemExit) as done:
        light.main(args)
    assert done.value.code == expected
    for key in (context.get("env_vars") or {}):
        assert os.environ[key] == ray_env[key]
    if "GONE" in (context.get("env_vars") or {}):
        assert os.environ["GONE"] == "ab" and os.environ["PYTHONPATH"] == "/job:/base"


def test_the_two_flags_are_read_in_either_form_and_the_rest_kept_in_order():
    assert light.split_args(["w.py", "--language", "PYTHON", "--x=1", "--serialized-runtime-env-context", "{}"]) == (
        "{}", "PYTHON", ["w.py", "--x=1"])
    assert light.split_args(["w.py", "--language=JAVA"]) == (None, "JAVA", ["w.py"])


@pytest.mark.parametrize("context, language", [
    ({"java_jars": ["/a.jar"]}, "PYTHON"), ({"a_field_ray_added": 1}, "PYTHON"), ({}, "JAVA"), (None, "PYTHON"),
])
def test_anything_else_goes_to_rays_own_script(context, language):
    assert not light.handled_here(context, language)


def test_a_real_worker_command_runs_without_ray_imported_by_the_setup_step(tmp_path):
    """The script as the raylet runs it: its variables reach the worker, which gets its arguments; the setup
    step itself never imported Ray (it execs before anything could)."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"argv": sys.argv[1:], "foo": os.environ.get("FOO"), "ray": "ray" in sys.modules}))
    """))
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(f"""
        import os, runpy, sys
        real = os.execvp
        def execvp(file, args):
            print("RAY_IMPORTED" if "ray" in sys.modules else "NO_RAY", flush=True)
            real(file, args)
        os.execvp = execvp
        sys.argv = [{light.__file__!r}, *sys.argv[1:]]
        runpy.run_path({light.__file__!r}, run_name="__main__")
    """))
    context = json.dumps({"env_vars": {"FOO": "bar"}, "py_executable": sys.executable})
    proc = subprocess.run(
        [sys.executable, str(probe), str(worker), f"--serialized-runtime-env-context={context}", "--x=a b",
         "--language=PYTHON"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.strip().splitlines()
    assert first == "NO_RAY"
    assert json.loads(last) == {"argv": ["--x=a b"], "foo": "bar", "ray": False}


RAYLET = ["/venv/ray/core/src/ray/raylet/raylet", "--maximum_startup_concurrency=2", "--num_prestart_python_workers=2",
          "--python_worker_command=/venv/bin/python /venv/ray/_private/workers/setup_worker.py "
          "/venv/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1 RAY_WORKER_DYNAMIC_OPTION_PLACEHOLDER"]


def test_the_raylet_starts_workers_through_it_may_start_four_at_once_and_prestarts_none_of_its_own():
    cmd = raylet_command(RAYLET, 4, "/opt/raytrain/clusters/ray_setup_worker.py", no_idle_workers=True)
    assert cmd[1] == "--maximum_startup_concurrency=4"
    # no processes with an empty runtime env for the first job (no raytrain actor could use them)
    assert cmd[2] == "--num_prestart_python_workers=0"
    assert cmd[3] == ("--python_worker_command=/venv/bin/python /opt/raytrain/clusters/ray_setup_worker.py "
                      "/venv/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1 "
                      "RAY_WORKER_DYNAMIC_OPTION_PLACEHOLDER")
    assert raylet_command(["raylet", "--maximum_startup_concurrency=16"], 4)[1] == "--maximum_startup_concurrency=16"
    assert head_command(RAYLET, "raylet", None, False) == RAYLET  # nothing asked: Ray's command
    # the idle processes follow the raylet_flags tuning (the startup floor), not the setup step or the dashboard's
    assert head_command(RAYLET, "raylet", None, False, min_startup=4)[2] == "--num_prestart_python_workers=0"
    assert head_command(RAYLET, "raylet", None, True, setup_worker="/s.py")[2] == "--num_prestart_python_workers=2"
    assert raylet_command(RAYLET, 4, "/s.py")[2] == "--num_prestart_python_workers=2"
    # a path that would need quoting, or a command without Ray's script: left as Ray wrote it
    assert python_worker_command("/venv/bin/python /a/setup_worker.py w.py", "/my dir/s.py") == "/venv/bin/python /a/setup_worker.py w.py"
    assert python_worker_command("/venv/bin/python other.py", "/s.py") == "/venv/bin/python other.py"


def test_the_startup_floor_and_the_setup_step_come_from_the_environment():
    from raytrain.ray_tuning.ray_start import light_setup_worker

    assert startup_concurrency({}) == 4 and light_setup_worker({})
    assert not light_setup_worker({"RAYTRAIN_RAY_TUNING": "off"})
    # Ray's defaults throughout: Ray's setup step, Ray's startup concurrency
    assert startup_concurrency({"RAYTRAIN_RAY_TUNING": "off"}) == 0 and not light_setup_worker({"RAYTRAIN_RAY_TUNING": "off"})


def test_rays_setup_worker_is_where_the_raylet_command_names_it():
    import ray

    path = os.path.join(os.path.dirname(ray.__file__), "_private", "workers", "setup_worker.py")
    assert os.path.isfile(path)
    import inspect

    from ray._private import ray_constants, services

    assert ray_constants.SETUP_WORKER_FILENAME == "setup_worker.py"
    assert "--maximum_startup_concurrency=" in inspect.getsource(services)
    assert "--python_worker_command=" in inspect.getsource(services)


def test_a_cpu_jobs_processes_start_with_rays_jemalloc_preloaded(monkeypatch, tmp_path):
    """RAYTRAIN_CPU_ALLOCATOR=jemalloc in a process's runtime env (a CPU job's, raytrain.targets.base) puts this
    node's Ray's libjemalloc.so in LD_PRELOAD before the exec, after what is preloaded already; any other value,
    or a Ray without the library, leaves LD_PRELOAD alone."""
    from raytrain.config.options import CPU_ALLOCATOR_VAR, CPU_ALLOCATORS

    assert (light.ALLOCATOR_VAR, light.JEMALLOC in CPU_ALLOCATORS) == (CPU_ALLOCATOR_VAR, True)  # spelt twice
    library = light.jemalloc_library()
    import ray

    assert library == os.path.join(os.path.dirname(ray.__file__), "core", "libjemalloc.so")  # Ray's Linux wheel
    monkeypatch.setattr(light.os, "execvp", lambda file, args: (_ for _ in ()).throw(SystemExit((file, args))))

    def start(env_vars: dict) -> str | None:
        context = {"env_vars": env_vars}
        with pytest.raises(SystemExit):
            light.main([*REST[:1], f"--serialized-runtime-env-context={json.dumps(context)}", *REST[1:],
                        "--language=PYTHON"])
        return os.environ.get("LD_PRELOAD")

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert start({"RAYTRAIN_CPU_ALLOCATOR": "jemalloc"}) == library
    assert start({"RAYTRAIN_CPU_ALLOCATOR": "jemalloc"}) == library  # already there: not twice
    monkeypatch.setenv("LD_PRELOAD", "/opt/libtcmalloc.so")  # the user's allocator is loaded first, so it wins
    assert start({"RAYTRAIN_CPU_ALLOCATOR": "jemalloc"}) == f"/opt/libtcmalloc.so:{library}"
    monkeypatch.delenv("LD_PRELOAD")
    assert start({"RAYTRAIN_CPU_ALLOCATOR": "glibc"}) is None  # --env RAYTRAIN_CPU_ALLOCATOR=glibc
    assert start({}) is None  # a GPU job's processes, Ray's own
    monkeypatch.setattr(light, "ray_package_dir", lambda: str(tmp_path))  # a Ray without the library
    assert start({"RAYTRAIN_CPU_ALLOCATOR": "jemalloc"}) is None


def test_a_preloaded_jemalloc_runs_python_and_torch(tmp_path):
    """The preloaded library really replaces malloc in a Python that imports torch: no loader error, and the
    process maps it (what the preflight reports as the worker's allocator)."""
    env = {**os.environ, "RAYTRAIN_CPU_ALLOCATOR": "jemalloc"}
    env.pop("LD_PRELOAD", None)
    assert light.preload_allocator(env) == light.jemalloc_library()
    code = ("import torch; from raytrain.runtime.driver.preflight import allocator; "
            "x = torch.randn(512, 512); print(allocator(), float((x @ x).sum()) == float((x @ x).sum()))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["jemalloc", "True"], proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
