"""Ray's ``setup_worker.py`` without importing Ray: the first step of every worker process on a raytrain node.

The raylet starts each worker process (an actor, a task worker, a job's supervisor) as
``python setup_worker.py default_worker.py ARGS --serialized-runtime-env-context=CTX --language=PYTHON``.
Ray's script reads the runtime env context (env vars, a command prefix, another Python), sets the
variables and execs ``bash -c "exec PYTHON default_worker.py ARGS"``, where the worker imports Ray and starts.
To read a small JSON object it imports all of Ray first, a second time per process: about 0.3 s of CPU per
worker process, four to five of which start with every raytrain job (the job's supervisor, Train's
controller and its synchronisation actor, one per worker), on a 2-core node all at once.

This script does the same with the standard library: the same variables (``${VAR}`` expanded, unknown ones
made empty, as Ray's ``update_envs``), the same command, the same ``bash -c`` exec. A context it does not
know (a field Ray added, Java jars, a language other than Python, Windows) goes to Ray's own script.

One addition: a process whose environment has ``RAYTRAIN_CPU_ALLOCATOR=jemalloc`` (a job whose workers train
on CPU: raytrain.targets.base) starts with the jemalloc that Ray ships for its raylet (``ray/core/libjemalloc.so``
of this node's Ray) in ``LD_PRELOAD``, after anything the environment preloads already (an allocator the user
preloads wins). It replaces glibc's malloc for the whole process; a CPU job's steps were 6-15 % shorter with
it (docs/benchmarks.md). Where that file does not exist, nothing is preloaded and glibc's malloc stays.

raytrain's ``ray start`` (raytrain.ray_tuning.ray_start) puts this file in the raylet's
``--python_worker_command`` in place of Ray's while the ``light_setup_worker`` tuning is on (so with
``RAYTRAIN_RAY_TUNING=off`` Ray's own setup step runs, and no jemalloc is preloaded).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from typing import MutableMapping

CONTEXT_FLAG = "--serialized-runtime-env-context"
LANGUAGE_FLAG = "--language"
# RuntimeEnvContext's fields (ray/_private/runtime_env/context.py) this script knows how to apply
KNOWN_FIELDS = {"command_prefix", "env_vars", "py_executable", "override_worker_entrypoint", "java_jars"}
UNSET_VAR = re.compile(r"\$\{[A-Z0-9_]+\}")
ALLOCATOR_VAR = "RAYTRAIN_CPU_ALLOCATOR"  # raytrain.config.options.CPU_ALLOCATOR_VAR (no raytrain import here)
JEMALLOC = "jemalloc"


def split_args(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(context, language, the rest), as Ray's ``parse_known_args`` reads the two flags (``--flag=V`` or
    ``--flag V``; the last one wins)."""
    context = language = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        for flag in (CONTEXT_FLAG, LANGUAGE_FLAG):
            if arg == flag and i + 1 < len(argv):
                value, i = argv[i + 1], i + 2
                break
            if arg.startswith(flag + "="):
                value, i = arg[len(flag) + 1:], i + 1
                break
        else:
            rest.append(arg)
            i += 1
            continue
        if flag == CONTEXT_FLAG:
            context = value
        else:
            language = value
    return context, language, rest


def expand(value: str) -> str:
    """Ray's ``update_envs`` for one value: ``$VAR``/``${VAR}`` expanded, a ``${VAR}`` left unset made empty."""
    return UNSET_VAR.sub("", os.path.expandvars(value))


def worker_command(context: dict, rest: list[str]) -> str:
    """The ``bash -c`` line Ray's ``RuntimeEnvContext.exec_worker`` builds for a Python worker."""
    args = list(rest)
    if context.get("override_worker_entrypoint"):
        args[0] = context["override_worker_entrypoint"]
    executable = context.get("py_executable") or sys.executable
    return " ".join([*(context.get("command_prefix") or []), "exec", executable, *(shlex.quote(a) for a in args)])


def handled_here(context: dict | None, language: str | None) -> bool:
    return (
        isinstance(context, dict)
        and set(context) <= KNOWN_FIELDS
        and not context.get("java_jars")
        and language == "PYTHON"
        and sys.platform.startswith("linux")
    )


def ray_package_dir() -> str | None:
    """This node's Ray package folder, found without importing Ray."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    return os.path.dirname(spec.origin) if spec and spec.origin else None


def jemalloc_library() -> str | None:
    """Ray's own jemalloc (``ray/core/libjemalloc.so``, in Ray's Linux wheels), or None where it is missing."""
    folder = ray_package_dir()
    path = os.path.join(folder, "core", "libjemalloc.so") if folder else None
    return path if path and os.path.isfile(path) else None


def preload_allocator(env: MutableMapping[str, str]) -> str | None:
    """Where ``env`` asks for jemalloc (``RAYTRAIN_CPU_ALLOCATOR=jemalloc``), add Ray's jemalloc to its
    ``LD_PRELOAD`` (last: a library already preloaded keeps its malloc); the library added, or None."""
    if env.get(ALLOCATOR_VAR, "").strip().lower() != JEMALLOC:
        return None
    library = jemalloc_library()
    if library is None:
        return None
    preloaded = [p for p in re.split(r"[: ]+", env.get("LD_PRELOAD", "")) if p]
    if library not in preloaded:
        env["LD_PRELOAD"] = ":".join([*preloaded, library])
    return library


def ray_setup_worker(argv: list[str]) -> None:
    """Run Ray's own setup_worker.py with these arguments (found without importing Ray)."""
    import runpy

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # this folder shadows nothing then
    script = os.path.join(ray_package_dir() or "", "_private", "workers", "setup_worker.py")
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str]) -> None:
    raw, language, rest = split_args(argv)
    try:
        context = json.loads(raw or "{}")
    except ValueError:
        context = None
    if not handled_here(context, language) or not rest:
        ray_setup_worker(argv)
        return
    for key, value in (context.get("env_vars") or {}).items():
        os.environ[key] = expand(value)
    preload_allocator(os.environ)
    os.execvp("bash", ["bash", "-c", worker_command(context, rest)])


if __name__ == "__main__":
    main(sys.argv[1:])
