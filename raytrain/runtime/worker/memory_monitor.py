"""A background sampler of this worker's memory: NVML on a GPU worker, process RSS on a CPU worker.

    monitor = MemoryMonitor(interval=1.0).start()   # gpu=None: a GPU worker if NVML sees this worker's GPU
    ...                                             # training; monitor.latest(), monitor.metrics()
    peak = monitor.stop()                            # {"source": "gpu", "gpu_memory_peak": ..., ...}

Every sample records the process RSS; on a GPU worker also the GPU's memory used (device-wide, NVML's
``used``: includes the CUDA context and any other process on that GPU, so compare it with a plan's GPU
total rather than with ``torch.cuda.max_memory_allocated``), this process's own GPU memory, utilisation (%)
and power (W).

This process's own GPU memory (:func:`own_gpu_memory`): NVML lists each process on the GPU by its PID in the
host's PID namespace, which a container (Kubernetes, docker) does not see: ``os.getpid()`` there is the
container's number. So the PIDs matched are every PID this process has in the namespaces ``/proc/self/status``
(``NSpid``) shows (the host's too where /proc is the host's); when none matches, the PyTorch caching
allocator's ``torch.cuda.memory_reserved`` (if torch is imported and CUDA initialised in this process) stands
in, and ``gpu_process_memory_source`` says which was used ("nvml" or "torch_reserved"). What the fallback
cannot see: the CUDA context (about 0.3-0.5 GiB) and memory allocated outside PyTorch's allocator (NCCL
buffers, cuBLAS workspaces, other libraries), so it is lower than NVML's figure for the same process.

The worker's GPU is CUDA ordinal ``device`` (default 0) mapped through ``CUDA_VISIBLE_DEVICES`` (indices or
``GPU-``/``MIG-`` UUIDs, as Ray sets them) to the NVML device, since NVML numbers every GPU on the machine.
No Ray and no torch here; pass ``nvml`` (a pynvml-like object) and ``rss`` (a callable) to test it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from raytrain.nvml import nvml_call, nvml_errors


def process_rss() -> int | None:
    """Resident set size of this process in bytes: psutil, else /proc/self/statm; None if neither works."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


@dataclass(frozen=True)
class Sample:
    time: float  # time.time()
    rss: int | None = None
    gpu_memory_used: int | None = None  # bytes, whole device
    gpu_process_memory: int | None = None  # bytes, this process, where NVML reports it
    gpu_utilization: int | None = None  # %
    power_w: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


_PEAK_FIELDS = ("rss", "gpu_memory_used", "gpu_process_memory", "gpu_utilization", "power_w")


def own_pids() -> set[int]:
    """This process's PIDs: ``os.getpid()`` plus each PID ``NSpid`` lists (outermost namespace /proc shows
    first), so a /proc mounted from an outer namespace gives the PID NVML reports."""
    pids = {os.getpid()}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    pids.update(int(p) for p in line.split()[1:] if p.isdigit())
                    break
    except OSError:
        pass
    return pids


def torch_reserved(device: int = 0) -> int | None:
    """``torch.cuda.memory_reserved(device)`` where this process already imported torch and initialised CUDA
    (never imports torch, never initialises CUDA: a sampler must not create a CUDA context)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return int(cuda.memory_reserved(device))


def torch_max_allocated(device: int = 0) -> int | None:
    """``torch.cuda.max_memory_allocated(device)`` under the same rule as :func:`torch_reserved`: the
    figure the planner's ``gpu_allocated`` estimates."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return int(cuda.max_memory_allocated(device))


def own_gpu_memory(procs: list, pids: set[int], reserved: Callable[[], int | None]) -> tuple[int | None, str | None]:
    """(bytes, source): the usedGpuMemory NVML lists for one of ``pids``, else ``reserved()``."""
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        if getattr(p, "pid", None) in pids and isinstance(used, int):
            return used, "nvml"
    value = reserved()
    return (value, "torch_reserved") if isinstance(value, int) else (None, None)


def resolve_handle(nvml: Any, device: int = 0, visible: str | None = None) -> Any | None:
    """The NVML handle of CUDA ordinal ``device`` under ``CUDA_VISIBLE_DEVICES`` (``visible``)."""
    if visible is None:
        return nvml_call(nvml.nvmlDeviceGetHandleByIndex, device)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if device >= len(entries):
        return None
    entry = entries[device]
    if entry.isdigit():
        return nvml_call(nvml.nvmlDeviceGetHandleByIndex, int(entry))
    return nvml_call(getattr(nvml, "nvmlDeviceGetHandleByUUID", None), entry)


class MemoryMonitor:
    """Samples at ``interval`` seconds in a daemon thread; thread-safe ``latest``/``peak``/``metrics``."""

    def __init__(
        self,
        interval: float = 1.0,
        *,
        gpu: bool | None = None,
        device: int = 0,
        nvml: Any | None = None,
        rss: Callable[[], int | None] | None = None,
        reserved: Callable[[], int | None] | None = None,
    ):
        if interval <= 0:
            raise ValueError("interval must be > 0 seconds")
        self.interval = interval
        self.device = device
        self._want_gpu = gpu
        self._nvml = nvml
        self._rss = rss or process_rss
        self._reserved = reserved or (lambda: torch_reserved(device))
        self._pids = own_pids()
        self.process_memory_source: str | None = None  # "nvml" or "torch_reserved": see own_gpu_memory
        self._handle: Any = None
        self._nvml_open = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: Sample | None = None
        self._peak: dict[str, float | int | None] = dict.fromkeys(_PEAK_FIELDS)
        self._count = 0
        self._errors = 0  # failed samples
        self.error: str | None = None  # the first failure, "Type: message"
        self.source = "cpu"

    # -- NVML --------------------------------------------------------------------------------------------
    def _open_gpu(self) -> None:
        if self._want_gpu is False:
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self._want_gpu is None and visible is not None and not visible.strip():
            return  # Ray gives CPU workers an empty CUDA_VISIBLE_DEVICES
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return
        try:
            nvml.nvmlInit()
        except nvml_errors():  # no library / no driver
            return
        handle = resolve_handle(nvml, self.device, visible)
        if handle is None:
            nvml_call(getattr(nvml, "nvmlShutdown", None))
            return
        self._nvml, self._handle, self._nvml_open, self.source = nvml, handle, True, "gpu"

    def _close_gpu(self) -> None:
        if self._nvml_open:
            nvml_call(getattr(self._nvml, "nvmlShutdown", None))
            self._nvml_open = False

    def _gpu_fields(self) -> dict:
        nvml, h = self._nvml, self._handle
        mem = nvml_call(getattr(nvml, "nvmlDeviceGetMemoryInfo", None), h)
        util = nvml_call(getattr(nvml, "nvmlDeviceGetUtilizationRates", None), h)
        power_mw = nvml_call(getattr(nvml, "nvmlDeviceGetPowerUsage", None), h)
        procs = nvml_call(getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None), h) or []
        own, source = own_gpu_memory(procs, self._pids, self._reserved)
        if source is not None:
            self.process_memory_source = source
        return {
            "gpu_memory_used": getattr(mem, "used", None),
            "gpu_process_memory": own if isinstance(own, int) else None,
            "gpu_utilization": getattr(util, "gpu", None),
            "power_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        }

    # -- sampling ----------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """Take one sample now and fold it into latest/peak."""
        fields = {"rss": self._rss()}
        if self.source == "gpu":
            fields.update(self._gpu_fields())
        s = Sample(time=time.time(), **fields)
        with self._lock:
            self._latest = s
            self._count += 1
            for key in _PEAK_FIELDS:
                value = getattr(s, key)
                if value is not None and (self._peak[key] is None or value > self._peak[key]):
                    self._peak[key] = value
        return s

    def _sample_safely(self) -> None:
        try:
            self.sample()
        except Exception as exc:  # a sampler must never take the training process down
            self._failed(exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample_safely()

    def _failed(self, exc: Exception) -> None:
        """Record a failed sample; the first is logged (once) and kept in :meth:`peak` as ``error``."""
        with self._lock:
            self._errors += 1
            if self.error is not None:
                return
            self.error = f"{type(exc).__name__}: {exc}"
        print(f"raytrain: the memory sampler failed ({self.error}); memory readings may be incomplete",
              file=sys.stderr, flush=True)

    def start(self) -> "MemoryMonitor":
        if self._thread is not None:
            return self
        self._open_gpu()
        self._sample_safely()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="raytrain-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling (after one last sample) and return :meth:`peak`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None
            self._sample_safely()
        self._close_gpu()
        return self.peak()

    def __enter__(self) -> "MemoryMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results -----------------------------------------------------------------------------------------
    def latest(self) -> Sample | None:
        with self._lock:
            return self._latest

    def peak(self) -> dict:
        """{"source", "samples", "errors" (failed samples), "error" (the first, or None), and the peak of each
        field: rss, gpu_memory_used, ..., power_w}."""
        with self._lock:
            return {"source": self.source, "samples": self._count, "errors": self._errors, "error": self.error,
                    "gpu_process_memory_source": self.process_memory_source,
                    **{f"{k}_peak": v for k, v in self._peak.items()}}

    def metrics(self) -> dict:
        """Flat numbers for a training report: GB and the peak so far (GPU fields only on GPU workers)."""
        latest, peak = self.latest(), self.peak()
        if latest is None:
            return {}
        out: dict[str, float] = {}

        def put(name: str, value: float | None, scale: float = 1e9) -> None:
            if value is not None:
                out[name] = round(value / scale, 3)

        put("rss_gb", latest.rss)
        put("rss_peak_gb", peak["rss_peak"])
        if self.source == "gpu":
            put("gpu_mem_gb", latest.gpu_memory_used)
            put("gpu_mem_peak_gb", peak["gpu_memory_used_peak"])
            put("gpu_util", latest.gpu_utilization, 1)
            put("power_w", latest.power_w, 1)
        return out
