"""How a worker's failure reads in the job's log: its traceback once, from the job's own frames.

Ray Train logs a train function's error itself ("Error in training function:" and a traceback that starts
in raytrain's worker, after the function has returned), the driver printed the ``WorkerGroupError`` it got
(the same traceback again, inside Ray Train's frames), and a terminal that followed the job then saw the
failing rank's last lines a third time. Now the worker prints the traceback from the first frame outside
raytrain (:func:`print_failure`), as Python would for the job run alone, Ray Train's copy is left out
(:func:`quiet_ray_train_errors`), and the driver prints its own only for an error that no worker raised.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from types import FrameType

import raytrain

PACKAGE_DIR = os.path.dirname(os.path.abspath(raytrain.__file__))  # raytrain/, wherever this module sits in it


def _launcher_frame(frame: FrameType) -> bool:
    """A frame of raytrain's package, or of ``runpy`` (which runs a script-mode job as ``__main__``)."""
    return frame.f_code.co_filename.startswith(PACKAGE_DIR + os.sep) or frame.f_globals.get("__name__") == "runpy"


def job_traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the first frame that is the job's (all of it if it has none)."""
    tb = exc.__traceback__
    while tb is not None and _launcher_frame(tb.tb_frame):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


SHIPPED = "raytrain_traceback"  # the attribute that carries the job's traceback to the driver
SHIPPED_CHARS = 8000  # the most of it that travels (its end: the frames nearest the error and the error)


# What a collective raises on a rank whose peer died or left: that rank's failure is a consequence
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "NCCL communicator was aborted",
             "remote process exited or there was a network error")


def lost_a_peer(exc: BaseException) -> str | None:
    """The PEER_LOST phrase in ``exc``'s message (None: ``exc`` is not a peer's loss)."""
    text = str(exc)
    return next((m for m in PEER_LOST if m in text), None)


def print_failure(exc: BaseException, rank: int | None = None) -> None:
    """The job's traceback of ``exc`` on stderr (what the job's log and the rank's own log keep), also
    attached to ``exc``, which Ray Train pickles to the driver: the rank's log reaches the storage through a
    copier of its own that may be behind when the driver reports the failure (raytrain.runtime.worker.rank_log).
    A rank that only lost a peer inside a collective (the rank that failed first says why) puts its traceback in
    its own log alone and one line in the job's."""
    text = job_traceback(exc)
    try:
        setattr(exc, SHIPPED, text[-SHIPPED_CHARS:])
    except (AttributeError, TypeError):  # an exception without a __dict__: its rank's log alone keeps it
        pass
    phrase = lost_a_peer(exc)
    if phrase is not None and rank is not None:
        from raytrain.runtime.worker import rank_log

        if rank_log.write_own(text):
            text = (f"raytrain: rank {rank} stopped: a peer left the collective it was in ({type(exc).__name__}: "
                    f"... {phrase}); its traceback is in its log (`raytrain jobs logs JOB --rank {rank}`)\n")
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def shipped_traceback(exc: BaseException) -> str | None:
    """The job's traceback a worker attached to ``exc`` or to an exception in its chain (None: none did)."""
    seen = set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        text = getattr(exc, SHIPPED, None)
        if isinstance(text, str):
            return text
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    return None


class _DropRayTrainError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Error in training function")


def quiet_ray_train_errors() -> None:
    """Leave out Ray Train's own log line of a train function's error (the worker printed it already)."""
    from raytrain.ray_tuning.ray_access import ray_train_error_logger

    name = ray_train_error_logger()
    if name is None:  # a Ray that logs it elsewhere: its copy stays in the log
        return
    logger = logging.getLogger(name)
    if not any(isinstance(f, _DropRayTrainError) for f in logger.filters):
        logger.addFilter(_DropRayTrainError())
