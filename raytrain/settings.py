"""Every environment variable raytrain reads, declared once: its name, type, default, who sets it and where
it applies. Code reads them through :func:`get` (typed) or :func:`raw`, never ``os.environ`` directly; the
settings page (docs/settings.md) is generated from :data:`SETTINGS` (``python -m raytrain.settings``).

Audiences:
- ``user``: a knob a user may set, documented.
- ``internal``: raytrain sets it for its own processes (the driver, the workers); not for users.
- ``tests``: read by the test suite and scripts/install.sh's tests, not by the package.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from raytrain.errors import ConfigError

PREFIX = "RAYTRAIN_"
TYPES = ("text", "path", "int", "seconds", "switch", "choice", "json")


@dataclass(frozen=True)
class Setting:
    name: str
    type: str  # one of TYPES; "switch": "1" on, "0" off
    default: Any  # the typed value when unset (None: not set)
    audience: str  # user | internal | tests
    applies: str  # where it is read: CLI, local cluster, driver, workers, ...
    help: str
    choices: tuple[str, ...] = ()
    shown: str | None = None  # the default as the settings page shows it, where the value alone says too little

    def parse(self, value: str) -> Any:
        """``value`` as this setting's type; a ConfigError naming the variable where it is not one."""
        text = value.strip()

        def bad(what: str) -> ConfigError:
            return ConfigError(f"{self.name}={value}: {what}", flag=self.name)

        if self.type in ("text", "json"):
            return value
        if self.type == "path":
            return os.path.expanduser(text) if text else None
        if self.type == "int":
            try:
                return int(text)
            except ValueError:
                raise bad("expected a whole number") from None
        if self.type == "seconds":
            try:
                out = float(text)
            except ValueError:
                raise bad("expected a number of seconds") from None
            if not math.isfinite(out) or out < 0:
                raise bad("expected a finite number of seconds, 0 or more")
            return out
        if self.type == "switch":
            if text not in ("0", "1"):
                raise bad("expected 1 (on) or 0 (off)")
            return text == "1"
        if self.type == "choice":
            if text.lower() not in self.choices:
                raise bad(f"expected one of {', '.join(self.choices)}")
            return text.lower()
        raise AssertionError(self.type)


def _s(name, type, default, audience, applies, help, choices=(), shown=None) -> Setting:
    return Setting(PREFIX + name, type, default, audience, applies, help, tuple(choices), shown)


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    # -- for users
    _s("HOME", "path", None, "user", "CLI", "raytrain's state: the local cluster's record and auth token, the "
       "default runs folder (`runs/`), job code copies", shown="`~/.raytrain`"),
    _s("ADDRESS", "text", None, "user", "CLI", "the Ray cluster `submit` and `jobs` use when `--address` is not "
       "given (`http://HEAD:8265`)", shown="the local cluster"),
    _s("PORT", "int", 6379, "user", "CLI", "the local cluster's GCS port (`cluster up --port`)"),
    _s("DASHBOARD_PORT", "int", 8265, "user", "CLI",
       "the local cluster's dashboard / Jobs API port (`cluster up --dashboard-port`)"),
    _s("RAY_TEMP_DIR", "path", None, "user", "CLI", "the private parent of Ray's temp folder (sockets, logs); "
       "must be yours and not writable by others", shown="`/tmp/raytrain-UID`"),
    _s("JOIN_TIMEOUT_S", "seconds", 90.0, "user", "CLI",
       "how long `cluster join` waits for the new node to register with the head"),
    _s("CPU_ALLOCATOR", "choice", None, "user", "job", "the malloc of CPU workers; `glibc` keeps glibc's "
       "([CPU workers](cluster.md#cpu-workers))", ("jemalloc", "glibc"),
       shown="`jemalloc` for CPU jobs on nodes raytrain starts"),
    _s("BIND_CORES", "switch", True, "user", "job",
       "bind each CPU worker's training thread to a core of its own where the workers hold every core"),
    _s("DS_SHM_COMM", "switch", False, "user", "job",
       "1 keeps DeepSpeed's `deepspeed_shm_comm` op on CPU workers (compiled on first use)"),
    _s("PREEMPT_FILE", "path", None, "internal", "workers",
       "the file a Kubernetes preStop hook writes to give the workers a preemption notice (its content: the "
       "deadline, seconds since the epoch); set in the pods raytrain generates; unset: no file is watched"),
    _s("LOCAL_UPLOAD", "switch", False, "user", "CLI or job", "1: upload the job's folder as Ray's "
       "`working_dir` on the local cluster too, instead of copying it"),
    _s("RAY_TUNING", "choice", "on", "user", "cluster up, CLI or job", "`off`: none of raytrain's Ray tunings; "
       "stock Ray's behaviour through public APIs only ([ray-tuning.md](ray-tuning.md)); set for `cluster up` "
       "(the local head) and for `submit` (passed on to the job)", ("on", "off")),
    _s("TORCH_CPU_INDEX", "text", "https://download.pytorch.org/whl/cpu", "user", "`scripts/install.sh`",
       "the index (or a mirror) the CPU build of torch is installed from on a machine without an NVIDIA GPU"),
    # -- set by raytrain for its own processes
    _s("PLAN", "json", None, "internal", "job", "the resolved plan the CLI submitted (driver, controller)"),
    _s("RUN_NAME", "text", None, "internal", "job", "the run's folder name in the storage"),
    _s("VERBOSE", "switch", False, "internal", "job", "`submit -v`: the job's log keeps Ray's own lines"),
    _s("JOB_CODE", "path", None, "internal", "job", "on the local cluster: the job's copy of its folder "
       "(`$RAYTRAIN_HOME/job-code/<job id>`), first on `PYTHONPATH`"),
    _s("DEEPSPEED_CONFIG", "path", None, "internal", "job", "script mode: the resolved DeepSpeed config as a "
       "JSON file ([script-mode.md](script-mode.md)); a script may read it"),
    _s("CLIENT_TIMINGS", "json", None, "internal", "job", "the CLI's timings before the submit (`--timings`)"),
    # The driver tells each worker process's setup hook (raytrain.runtime.worker.early_imports) what to import as
    # the process starts, before any task: the hook runs with no plan and no arguments, so the workers' runtime
    # env is its only channel.
    _s("WORKER_IMPORTS", "text", "", "internal", "job", "set by the driver on the workers' runtime env for their "
       "process setup hook (which has no other channel): the modules each worker process imports as it starts"),
    _s("WORKER_GPU", "switch", False, "internal", "job", "set by the driver on the workers' runtime env for their "
       "process setup hook (which has no other channel): the workers use GPUs"),
    # -- the test suite
    _s("NVIDIA_PROC", "path", "/proc/driver/nvidia", "tests", "`scripts/install.sh`",
       "where the install script looks for an NVIDIA driver (its tests point it elsewhere)"),
    _s("TEST_KUBECONFIG", "path", None, "tests", "pytest", "the kubeconfig of the Kubernetes API server "
       "`tests/k8s` runs against", shown="none: `tests/k8s` is skipped"),
    _s("TEST_KUBERAY_CRDS", "path", None, "tests", "pytest", "KubeRay's CRDs for `tests/k8s`",
       shown="`../shared/k8s-apiserver/kuberay-crds-1.6.2.yaml`"),
    _s("TEST_PORT", "int", None, "tests", "pytest", "pins the GCS port of the local cluster `tests/e2e` starts",
       shown="a free port"),
    _s("TEST_DASHBOARD_PORT", "int", None, "tests", "pytest", "pins its dashboard port", shown="a free port"),
    _s("TEST_MN_PORT", "int", None, "tests", "pytest",
       "pins the GCS port of the two-node cluster `tests/multinode` starts", shown="a free port"),
    _s("TEST_MN_DASHBOARD_PORT", "int", None, "tests", "pytest", "pins its dashboard port", shown="a free port"),
    _s("TEST_MN_NETNS", "text", "rt-node2", "tests", "pytest", "the network namespace of the second node"),
    _s("TEST_RECORDS", "path", None, "tests", "pytest, `.ci/run`",
       "a file where the suite records each cluster it starts, so `.ci/run` stops exactly those"),
]}


def job_settings() -> tuple[str, ...]:
    """The variables a job may be given with ``--env``: users' that the job reads."""
    return tuple(s.name for s in SETTINGS.values() if s.audience == "user" and "job" in s.applies)


def setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared raytrain setting (raytrain/settings.py)") from None


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's text as set (None: unset)."""
    setting(name)
    return (os.environ if env is None else env).get(name)


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The variable's typed value, its default when unset or empty (a ConfigError naming it when malformed)."""
    s = setting(name)
    value = raw(name, env)
    if value is None or (value.strip() == "" and s.type not in ("text", "json")):
        return s.default
    return s.parse(value)


AUDIENCES = {
    "user": ("For users", ""),
    "internal": ("Set by raytrain for the job", "Read them, do not set them."),
    "tests": ("For the test suite", "Read by the tests and the install script, not by raytrain."),
}


def _default(s: Setting) -> str:
    if s.shown is not None:
        return s.shown
    if s.default is None or s.default == "":
        return ""
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    return f"{s.default:g}" if isinstance(s.default, float) else str(s.default)


def markdown_table(audience: str) -> str:
    rows = ["| name | type | default | where | what it is for |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        if s.audience == audience:
            kind = " or ".join(f"`{c}`" for c in s.choices) if s.choices else s.type
            rows.append(f"| `{s.name}` | {kind} | {_default(s)} | {s.applies} | {s.help} |")
    return "\n".join(rows)


PAGE_HEAD = """# Settings: raytrain's environment variables

Generated from `raytrain/settings.py` (`python -m raytrain.settings > docs/settings.md`), the one place they
are declared; a test keeps this page in step. Flags and `--config` profiles are the way to configure a run
(see [cli.md](cli.md)); these variables are for what a flag does not cover. **Where** says where one must be
set: *CLI*, the environment of the `raytrain` command; *cluster up*, the environment of `raytrain cluster
up` / `cluster join` (read by the Ray processes it starts); *job*, the job's environment, given with `submit
--env NAME=VALUE`. Switches take `0` (off) or `1` (on); a malformed value is refused with the variable named.
"""

PAGE_TAIL = """
`_RAYTRAIN_COMPLETE` is Click's shell-completion variable ([cli.md](cli.md#watching-a-run)), not a setting.
"""


def markdown_page() -> str:
    parts = [PAGE_HEAD]
    for audience, (title, intro) in AUDIENCES.items():
        parts.append(f"\n## {title}\n\n" + (f"{intro}\n\n" if intro else "") + markdown_table(audience) + "\n")
    return "".join(parts) + PAGE_TAIL


if __name__ == "__main__":
    print(markdown_page(), end="")
