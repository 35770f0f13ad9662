"""Ray's log monitor as raytrain's local head runs it: ``python -m raytrain.clusters.ray_log_monitor ARGS``
does what ``python .../ray/_private/log_monitor.py ARGS`` does, polling idle log files less often.

The log monitor follows every log file of the node's workers and publishes new lines (the job's log gets a
worker's output through it). While no file has anything new it sleeps 0.1 s, hard-coded, and then reads every
file again: ten wake-ups a second on an idle node. Here it sleeps ``POLL_S`` (0.5 s) instead, so a
worker's line reaches the job's log up to half a second later; while lines keep coming it does not sleep at
all, as in Ray. That one sleep is the only change: the script's text is read, the sleep's argument replaced
(where the installed Ray has exactly one ``time.sleep(0.1)``; otherwise it runs unchanged) and run.
"""
from __future__ import annotations

import os
import sys


POLL_S = 0.5
IDLE_SLEEP = "time.sleep(0.1)"


def log_monitor_script() -> str:
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "_private", "log_monitor.py")


def patched_source(source: str, seconds: float) -> str:
    """The log monitor's source with its idle sleep set to ``seconds`` (unchanged unless it has exactly one)."""
    if source.count(IDLE_SLEEP) != 1:
        return source
    return source.replace(IDLE_SLEEP, f"time.sleep({seconds!r})")


def main() -> None:
    script = log_monitor_script()
    with open(script, encoding="utf-8") as f:
        source = patched_source(f.read(), POLL_S)
    sys.argv[0] = script
    code = compile(source, script, "exec")
    exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
