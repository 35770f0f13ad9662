"""NVML through the nvidia-ml-py package (``import pynvml``); every call degrades to "no GPU".

Each NVML query is made on its own (:func:`nvml_call`): a field the GPU or driver does not support
(``NVMLError_NotSupported``, or any other ``pynvml.NVMLError``), or a function an older nvidia-ml-py lacks,
becomes None and the rest of the answer stands. Anything else (a misspelt name, a wrong signature) raises;
tests/unit/test_library_names.py checks every pynvml name used here exists.
No NVML library, no driver, or no GPU gives an empty inventory, never an exception.

Functions take an optional ``nvml`` module (anything with pynvml's names) so the parsing of NVML answers
can be tested with a fake library; by default they import pynvml.
"""
from __future__ import annotations

from typing import Any, Callable

# FP32 cores per SM by compute capability major (minor where it differs), to derive the SM count from
# nvmlDeviceGetNumGpuCores when nvmlDeviceGetAttributes is not supported (it is for MIG and recent drivers).
CORES_PER_SM = {(6, 0): 64, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
                (9, 0): 128, (10, 0): 128, (12, 0): 128}


def _load(nvml: Any | None) -> Any | None:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def nvml_errors() -> tuple[type[BaseException], ...]:
    """What NVML itself raises: ``pynvml.NVMLError`` and its subclasses (NotSupported, NoPermission,
    GpuIsLost, FunctionNotFound for a symbol the driver's library lacks, LibraryNotFound, ...)."""
    try:
        import pynvml
    except ImportError:
        return ()
    return (pynvml.NVMLError,)


def nvml_call(fn: Callable | None, *args: Any) -> Any:
    """``fn(*args)``, or None when NVML says the query is unsupported or fails, or ``fn`` does not exist.

    Only NVML's own errors become None: an AttributeError or TypeError (a misspelt pynvml name, a wrong
    signature) is a bug and raises."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml_errors():
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _cuda_version(raw: Any) -> str | None:
    """NVML's CUDA driver version integer (12040) as ``12.4``."""
    if not isinstance(raw, int) or raw <= 0:
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"


def bandwidth_gb_s(bus_width_bits: int | None, max_memory_clock_mhz: int | None) -> float | None:
    """Peak memory bandwidth: bus width (bytes) x max memory clock x 2 (double data rate), in GB/s.

    A100 40GB: 5120 bits x 1215 MHz -> 1555 GB/s; H100 SXM: 5120 x 2619 -> 3352 GB/s;
    RTX 4090: 384 x 10501 -> 1008 GB/s, each the vendor's figure.
    """
    if not bus_width_bits or not max_memory_clock_mhz:
        return None
    return round(bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2 / 1e9, 1)


def _sm_count(nvml: Any, handle: Any, cores: int | None) -> int | None:
    attrs = nvml_call(getattr(nvml, "nvmlDeviceGetAttributes", None), handle)
    count = getattr(attrs, "multiprocessorCount", None)
    if isinstance(count, int) and count > 0:
        return count
    cc = nvml_call(getattr(nvml, "nvmlDeviceGetCudaComputeCapability", None), handle)
    if cores and isinstance(cc, tuple) and len(cc) == 2:
        per_sm = CORES_PER_SM.get(tuple(cc)) or CORES_PER_SM.get((cc[0], 0))
        if per_sm and cores % per_sm == 0:
            return cores // per_sm
    return None


def device_info(nvml: Any, handle: Any) -> dict:
    """One GPU's inventory; every field is None where NVML cannot answer."""

    def g(name: str) -> Callable | None:  # a function this nvidia-ml-py lacks answers None
        return getattr(nvml, name, None)

    mem = nvml_call(g("nvmlDeviceGetMemoryInfo"), handle)
    bus = nvml_call(g("nvmlDeviceGetMemoryBusWidth"), handle)
    mem_clock = nvml_call(g("nvmlDeviceGetMaxClockInfo"), handle, getattr(nvml, "NVML_CLOCK_MEM", 2))
    cores = nvml_call(g("nvmlDeviceGetNumGpuCores"), handle)
    util = nvml_call(g("nvmlDeviceGetUtilizationRates"), handle)
    power_mw = nvml_call(g("nvmlDeviceGetPowerUsage"), handle)
    limit_mw = nvml_call(g("nvmlDeviceGetEnforcedPowerLimit"), handle)
    cc = nvml_call(g("nvmlDeviceGetCudaComputeCapability"), handle)
    return {
        "name": _text(nvml_call(g("nvmlDeviceGetName"), handle)),
        "uuid": _text(nvml_call(g("nvmlDeviceGetUUID"), handle)),
        "memory_total": getattr(mem, "total", None),
        "memory_free": getattr(mem, "free", None),
        "memory_used": getattr(mem, "used", None),
        "memory_bus_width_bits": bus,
        "max_memory_clock_mhz": mem_clock,
        "bandwidth_gb_s": bandwidth_gb_s(bus, mem_clock),
        "cuda_cores": cores,
        "sm_count": _sm_count(nvml, handle, cores),
        "compute_capability": f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) and len(cc) == 2 else None,
        "utilization_gpu": getattr(util, "gpu", None),
        "utilization_memory": getattr(util, "memory", None),
        "temperature_c": nvml_call(g("nvmlDeviceGetTemperature"), handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        "power_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        "power_limit_w": limit_mw / 1000 if isinstance(limit_mw, (int, float)) else None,
    }


def gpu_inventory(nvml: Any | None = None) -> list[dict]:
    """Every GPU NVML sees on this machine (all of them, whatever CUDA_VISIBLE_DEVICES says), as dicts:
    index, name, uuid, memory_total/free/used (bytes), memory_bus_width_bits, max_memory_clock_mhz,
    bandwidth_gb_s, cuda_cores, sm_count, compute_capability, utilization_gpu/memory (%), temperature_c,
    power_w, power_limit_w, driver_version, cuda_version. [] without NVML, a driver or a GPU."""
    nvml = _load(nvml)
    if nvml is None:
        return []
    try:
        nvml.nvmlInit()
    except nvml_errors():  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return []
    try:
        count = nvml_call(nvml.nvmlDeviceGetCount) or 0
        driver = _text(nvml_call(getattr(nvml, "nvmlSystemGetDriverVersion", None)))
        cuda = _cuda_version(
            nvml_call(getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None))
            or nvml_call(getattr(nvml, "nvmlSystemGetCudaDriverVersion", None))
        )
        out = []
        for index in range(int(count)):
            handle = nvml_call(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            info = {"index": index, **device_info(nvml, handle), "driver_version": driver, "cuda_version": cuda}
            out.append(info)
        return out
    finally:
        nvml_call(getattr(nvml, "nvmlShutdown", None))


def gpu_count() -> int:
    """GPUs visible on this machine; 0 without a driver or without NVML."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        nvml_call(pynvml.nvmlShutdown)
