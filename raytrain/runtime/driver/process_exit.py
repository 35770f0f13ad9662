"""How the job's Ray drivers (the training driver, the utilities `jobs stop` and `gpus` run) exit."""
from __future__ import annotations

import os
import sys


def exit_without_finalizing(code: int) -> None:
    """End the process as a normal exit would (non-daemon threads joined, every atexit handler run: Ray's
    shutdown, logging's flush, output flushed), then skip the interpreter's finalization: with Ray loaded,
    tearing down its modules and C++ objects takes seconds after everything is said and done, and a Ray job
    is not SUCCEEDED, nor does `submit` return, until its driver process is gone."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
