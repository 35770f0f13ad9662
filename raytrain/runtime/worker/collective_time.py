"""Seconds this process spent blocked in collectives: the straggler watch's "not compute" (raytrain.straggler).

Method: time spent inside ``torch.distributed``'s ``Work.wait``. Every collective waits there, whatever the
layout: a synchronous call (all_reduce, all_gather, reduce_scatter, broadcast, barrier, send/recv, the
object collectives) waits on its work object inside the call, and an asynchronous one (ZeRO-3's prefetched
all-gathers, overlapped reductions, pipeline p2p) when its handle's ``wait()`` is called. So ZeRO 0-3, tp and
pp need nothing of their own, and DeepSpeed's comm layer (which keeps references to torch's functions) is
covered without patching it. One patch of a class attribute; per wait two clock reads.

On gloo (CPU) the wait blocks the host for the whole collective, so the time is exact. On NCCL the wait only
orders the GPU streams: a rank whose GPU is slow makes the others block later, at their next host sync (a
``.item()``), which counts as their compute; what this sees there is a rank slow on the host (data loading,
Python, CPU work), not a rank with a slow GPU.
"""
from __future__ import annotations

import time

_inside = [0.0, 0]  # seconds inside waits, current depth (a wait that waits on another counts once)
_installed = [False]


def seconds() -> float:
    """Seconds spent in collectives' waits since install (monotonic)."""
    return _inside[0]


def install() -> bool:
    """Time every ``Work.wait`` from now on; False where torch.distributed has no Work class to patch."""
    if _installed[0]:
        return True
    try:
        from torch.distributed.distributed_c10d import Work
    except ImportError:
        return False
    original = Work.wait
    clock = time.perf_counter

    def wait(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _inside[1]:
            return original(self, *args, **kwargs)
        _inside[1] = 1
        start = clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            _inside[0] += clock() - start
            _inside[1] = 0

    Work.wait = wait
    _installed[0] = True
    return True
