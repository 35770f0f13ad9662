"""Every environment variable raytrain reads, declared once: its name, type, default, who sets it and where
it applies. Code reads them through :func:`get` (typed) or :func:`raw`, never ``os.environ`` directly; the
settings page (docs/settings.md) is generated from :data:`SETTINGS` (``python -m raytrain.settings``).

Audiences:
- ``user``: a knob a user may set, documented.
- ``internal``: raytrain sets it for its own processes (the driver, the workers); not for users.
- ``ray-tuning``: turns one of raytrain's Ray tunings off (stock Ray's behaviour); for comparing against
  stock Ray and for working around a Ray release the tuning was not written for.
- ``install`` and ``tests``: read by scripts/install.sh and by the test suite, not by the package.
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
    audience: str  # user | internal | ray-tuning
    applies: str  # where it is read: CLI, local cluster, driver, workers, ...
    help: str
    choices: tuple[str, ...] = ()

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


def _s(name, type, default, audience, applies, help, choices=()) -> Setting:
    return Setting(PREFIX + name, type, default, audience, applies, help, tuple(choices))


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    # -- for users
    _s("HOME", "path", None, "user", "CLI, local cluster",
       "raytrain's state folder (cluster record, auth token, runs); default ~/.raytrain"),
    _s("ADDRESS", "text", None, "user", "CLI",
       "the Ray cluster to use (http://HEAD:8265) when --address is not given; default the local cluster"),
    _s("PORT", "int", 6379, "user", "CLI (cluster up)", "the local head's GCS port when --port is not given"),
    _s("DASHBOARD_PORT", "int", 8265, "user", "CLI (cluster up)",
       "the local head's dashboard (Jobs API) port when --dashboard-port is not given"),
    _s("RAY_TEMP_DIR", "path", None, "user", "CLI (cluster up/join)",
       "Ray's temp folder for nodes raytrain starts; default a private folder under /tmp/raytrain-UID"),
    _s("JOIN_TIMEOUT_S", "seconds", 90.0, "user", "CLI (cluster join)",
       "how long `cluster join` waits for the node to register with the head"),
    _s("K8S_POLL_S", "seconds", 2.0, "user", "CLI (--k8s)", "how often following a RayJob reads it"),
    _s("CPU_ALLOCATOR", "choice", None, "user", "workers (--env)",
       "a CPU job's malloc on nodes raytrain starts: jemalloc (the default there) or glibc",
       ("jemalloc", "glibc")),
    _s("BIND_CORES", "switch", True, "user", "workers (--env)",
       "0: never bind CPU workers' training threads to cores of their own"),
    _s("LOCAL_UPLOAD", "switch", False, "user", "CLI (local cluster; --env)",
       "1: upload the job's folder as Ray's working_dir on the local cluster too, as on other clusters"),
    _s("MONITOR_INTERVAL_S", "seconds", 1.0, "user", "workers (--env)",
       "how often each worker samples its GPU memory and utilisation"),
    _s("HF_LOG_EVERY_STEPS", "int", 1, "user", "workers (--env)",
       "script mode with the HF Trainer: ask the Trainer for a log every N steps"),
    _s("TRAIN_LOG_LEVEL", "text", "WARNING", "user", "driver (--env)", "Ray Train's log level in the job's log"),
    _s("DS_SHM_COMM", "switch", False, "user", "workers (--env)",
       "1: let DeepSpeed build and use its shared-memory CPU collectives (a compile of minutes on first use)"),
    # -- set by raytrain for its own processes
    _s("PLAN", "json", None, "internal", "driver, controller", "the resolved plan the CLI submitted"),
    _s("RUN_NAME", "text", None, "internal", "driver, controller, workers", "the run's folder name in storage"),
    _s("VERBOSE", "switch", False, "internal", "driver", "set by `submit -v`: the job's log keeps Ray's lines"),
    _s("JOB_CODE", "path", None, "internal", "driver, workers", "the local cluster's copy of the job's folder"),
    _s("CLIENT_TIMINGS", "json", None, "internal", "driver", "the CLI's timings before the submit"),
    _s("WORKER_IMPORTS", "text", "", "internal", "workers", "modules a worker process imports at start"),
    _s("WORKER_GPU", "switch", False, "internal", "workers", "the workers use GPUs"),
    _s("DEEPSPEED_CONFIG", "path", None, "internal", "script-mode scripts",
       "script mode: the resolved DeepSpeed config file (a script may read it)"),
    _s("PG_CLEANER", "switch", True, "internal", "controller",
       "0 (set by the local target): no detached placement-group cleaner actor per run"),
    _s("AUTOSCALING_COORDINATOR", "switch", True, "internal", "controller",
       "0 (set by the local target): no autoscaling coordinator on a cluster that never scales"),
    # -- Ray tunings: 0 gives stock Ray's behaviour for one of them
    _s("QUIET_HEAD", "switch", True, "ray-tuning", "local cluster",
       "0: nodes raytrain starts run Ray's default polls, dashboard modules, setup worker and Ray Client server"),
    _s("DASHBOARD_MODULES", "text", "", "ray-tuning", "local cluster",
       "the dashboard modules a node raytrain starts loads: `all`, or class names; default raytrain's set"),
    _s("RAY_CLIENT", "switch", False, "ray-tuning", "local cluster", "1: the head also starts Ray Client's server"),
    _s("LIGHT_SETUP_WORKER", "switch", True, "ray-tuning", "local cluster",
       "0: Ray's own worker setup script on nodes raytrain starts"),
    _s("LAZY_TORCH", "switch", True, "ray-tuning", "driver",
       "0: Ray Train's own TorchTrainer backend instead of raytrain's lazy one"),
    _s("LEAN_TRAINER", "switch", True, "ray-tuning", "controller",
       "0: keep Ray Train's callbacks that raytrain's runs do not use"),
    _s("PROMPT_POLL", "switch", True, "ray-tuning", "controller",
       "0: Ray Train's controller polls the workers on its own schedule"),
    _s("PRESTART", "switch", True, "ray-tuning", "driver", "0: no worker processes started ahead of the group"),
    _s("EARLY_IMPORTS", "switch", True, "ray-tuning", "workers",
       "0: workers import torch/deepspeed when the training function starts, not at process start"),
    # -- outside the package
    _s("TORCH_CPU_INDEX", "text", "https://download.pytorch.org/whl/cpu", "install", "scripts/install.sh",
       "PyTorch's CPU wheel index (a mirror) for machines without an NVIDIA GPU"),
    _s("NVIDIA_PROC", "path", "/proc/driver/nvidia", "tests", "scripts/install.sh",
       "where install.sh looks for an NVIDIA driver (its tests point it elsewhere)"),
    _s("TEST_KUBECONFIG", "path", None, "tests", "tests/k8s",
       "a kubeconfig of the Kubernetes API server tests/k8s run against (unset: they are skipped)"),
]}


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


def markdown_table() -> str:
    """The settings page's table (docs/settings.md is generated from it)."""
    rows = ["| variable | type | default | for | read by | what it does |", "| --- | --- | --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        default = "" if s.default in (None, "") else ("1" if s.default is True else "0" if s.default is False
                                                       else str(s.default))
        kind = f"{s.type} ({'/'.join(s.choices)})" if s.choices else s.type
        rows.append(f"| `{s.name}` | {kind} | {default} | {s.audience} | {s.applies} | {s.help} |")
    return "\n".join(rows)


PAGE_HEAD = """# Settings (environment variables)

Generated from `raytrain/settings.py` (`python -m raytrain.settings > docs/settings.md`); a test checks
this page matches. Flags always win over these variables. `user` settings are for you; `internal` ones are
set by raytrain for its own processes; `ray-tuning` ones turn one of raytrain's Ray tunings off (stock Ray's
behaviour) and exist for comparisons and for working around a Ray release a tuning was not written for.
A variable that applies to `workers` or the `driver` is given to a job with `--env NAME=VALUE`.

"""


def markdown_page() -> str:
    return PAGE_HEAD + markdown_table() + "\n"


if __name__ == "__main__":
    print(markdown_page(), end="")
