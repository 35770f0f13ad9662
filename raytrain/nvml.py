"""NVML through the nvidia-ml-py package (``import pynvml``); every call degrades to "no GPU"."""
from __future__ import annotations


def gpu_count() -> int:
    """GPUs visible on this machine; 0 without a driver or without NVML."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
