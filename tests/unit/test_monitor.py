"""raytrain.runtime.worker.memory_monitor: the sampler on a CPU worker for real (process RSS), and on a GPU worker with a
fake NVML library."""
import os
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from raytrain.runtime.worker.memory_monitor import MemoryMonitor, process_rss, resolve_handle
from tests.conftest import ROOT, needs

MB = 2**20


def statm_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_process_rss_agrees_with_proc_statm():
    assert abs(process_rss() - statm_rss()) < 8 * MB


def test_cpu_worker_reports_rss_and_its_peak():
    monitor = MemoryMonitor(interval=0.01, gpu=False).start()
    try:
        assert monitor.source == "cpu"
        before = monitor.latest().rss
        blob = b"\x01" * (96 * MB)  # written, so resident
        start = monitor.peak()["samples"]
        assert wait_for(lambda: monitor.peak()["samples"] >= start + 3)
        during = monitor.latest().rss
        del blob
    finally:
        peak = monitor.stop()
    assert during - before > 80 * MB
    assert peak["source"] == "cpu" and peak["rss_peak"] >= during
    assert peak["gpu_memory_used_peak"] is None
    metrics = monitor.metrics()
    assert metrics["rss_peak_gb"] == round(peak["rss_peak"] / 1e9, 3)
    assert not any(k.startswith("gpu") for k in metrics)


def test_stop_ends_the_thread():
    monitor = MemoryMonitor(interval=0.01, gpu=False)
    with monitor:
        assert any(t.name == "raytrain-monitor" for t in threading.enumerate())
    count = monitor.peak()["samples"]
    time.sleep(0.05)
    assert monitor.peak()["samples"] == count
    assert not any(t.name == "raytrain-monitor" for t in threading.enumerate())


def test_empty_cuda_visible_devices_means_cpu_worker(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    fake = FakeGPU()
    monitor = MemoryMonitor(interval=10, nvml=fake)
    monitor.start()
    monitor.stop()
    assert monitor.source == "cpu" and fake.inits == 0


def test_no_nvml_here_falls_back_to_rss(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip(needs("no NVIDIA driver", "this machine has an NVIDIA driver"))
    except pynvml.NVMLError:
        pass
    monitor = MemoryMonitor(interval=10)  # gpu=None: tries NVML for real, finds no library
    monitor.start()
    peak = monitor.stop()
    assert peak["source"] == "cpu" and peak["rss_peak"] > 0


class FakeGPU:
    """A pynvml-like library whose GPU memory use follows ``used`` sample by sample."""

    def __init__(self, used=(1_000, 5_000, 3_000)):
        self.used = list(used)
        self.calls = 0
        self.inits = self.shutdowns = 0
        self.handles = []

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        self.handles.append(i)
        return ("index", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(uuid)
        return ("uuid", uuid)

    def nvmlDeviceGetMemoryInfo(self, h):
        value = self.used[min(self.calls, len(self.used) - 1)]
        self.calls += 1
        return SimpleNamespace(total=80_000, free=80_000 - value, used=value)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90, memory=40)

    def nvmlDeviceGetPowerUsage(self, h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=1, usedGpuMemory=10), SimpleNamespace(pid=os.getpid(), usedGpuMemory=777)]


def test_gpu_worker_samples_nvml_and_keeps_the_peak(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    fake = FakeGPU(used=(1_000, 5_000, 3_000))
    monitor = MemoryMonitor(interval=60, device=1, nvml=fake, rss=lambda: 123)
    monitor.start()  # first sample: 1000
    monitor.sample()  # 5000
    monitor.sample()  # 3000
    latest = monitor.latest()
    peak = monitor.stop()  # last sample: 3000
    assert fake.handles == [3]  # CUDA ordinal 1 under CUDA_VISIBLE_DEVICES=2,3 is NVML device 3
    assert monitor.source == "gpu" and fake.inits == 1 and fake.shutdowns == 1
    assert latest.gpu_memory_used == 3_000 and latest.gpu_process_memory == 777
    assert latest.gpu_utilization == 90 and latest.power_w is None  # unsupported power: None, rest stands
    assert peak["gpu_memory_used_peak"] == 5_000 and peak["samples"] == 4 and peak["rss_peak"] == 123
    metrics = monitor.metrics()
    assert metrics["gpu_mem_peak_gb"] == round(5_000 / 1e9, 3) and metrics["gpu_util"] == 90
    assert "power_w" not in metrics


def test_background_thread_samples_the_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeGPU(used=(10, 20, 30, 40, 50, 60))
    with MemoryMonitor(interval=0.01, nvml=fake, rss=lambda: 1) as monitor:
        assert wait_for(lambda: monitor.peak()["samples"] >= 6)
    assert monitor.peak()["gpu_memory_used_peak"] == 60 and fake.handles == [0]


def test_resolve_handle_by_uuid_and_out_of_range():
    fake = FakeGPU()
    assert resolve_handle(fake, 0, "GPU-abc,GPU-def") == ("uuid", "GPU-abc")
    assert resolve_handle(fake, 1, "GPU-abc,GPU-def") == ("uuid", "GPU-def")
    assert resolve_handle(fake, 2, "0,1") is None
    assert resolve_handle(fake, 1, None) == ("index", 1)


def test_monitor_imports_neither_ray_nor_torch():
    code = textwrap.dedent(
        """
        import sys
        import raytrain.runtime.worker.memory_monitor
        print(sorted(m for m in ("ray", "torch", "deepspeed") if m in sys.modules))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_failing_sampler_is_logged_once_and_said_in_the_jobs_status(capsys, monkeypatch):
    """Every sample after the first raises: training goes on, stderr says it once, the memory event carries
    the error and `jobs status` (JobFacts.warnings) shows it."""
    from raytrain import events
    from raytrain.runtime.worker.reporter import Reporter

    calls = []

    def flaky_rss():
        calls.append(1)
        if len(calls) > 1:
            raise OSError("statm unreadable")
        return 100 * MB

    monitor = MemoryMonitor(interval=0.01, gpu=False, rss=flaky_rss).start()
    assert wait_for(lambda: monitor.peak()["errors"] >= 3)
    peak = monitor.stop()
    assert peak["error"] == "OSError: statm unreadable" and peak["rss_peak"] == 100 * MB
    err = capsys.readouterr().err
    assert err.count("the memory sampler failed") == 1 and "OSError: statm unreadable" in err

    lines = []
    monkeypatch.setattr(events, "emit", lambda kind, **data: lines.append(events.format_event(kind, **data)))
    reporter = Reporter(rank=1, train_batch=4)
    reporter.monitor = monitor
    reporter.memory_event(final=True)
    facts = events.JobFacts.from_lines(lines)
    assert facts.memory[1]["sampler_error"] == "OSError: statm unreadable"
    assert facts.warnings() == [
        "memory sampler failed on rank 1: OSError: statm unreadable (memory peaks cover the samples before it)"
    ]


def test_a_sampler_failing_from_the_first_sample_does_not_stop_the_start():
    def broken():
        raise RuntimeError("no /proc")

    monitor = MemoryMonitor(interval=0.01, gpu=False, rss=broken).start()
    peak = monitor.stop()
    assert peak["error"] == "RuntimeError: no /proc" and peak["rss_peak"] is None


class ContainerGPU(FakeGPU):
    """NVML inside a container: the GPU's processes are listed by their host PIDs, none of them ours."""

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=4_000_001, usedGpuMemory=900), SimpleNamespace(pid=4_000_002, usedGpuMemory=55)]


def test_in_a_pid_namespace_the_process_memory_falls_back_to_torch_reserved(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = MemoryMonitor(interval=60, nvml=ContainerGPU(), rss=lambda: 1, reserved=lambda: 640)
    monitor.start()
    peak = monitor.stop()
    assert monitor.latest().gpu_process_memory == 640  # not another process's 900, not None
    assert peak["gpu_process_memory_peak"] == 640 and peak["gpu_process_memory_source"] == "torch_reserved"
    # Neither NVML nor torch can tell: None, and no source.
    blind = MemoryMonitor(interval=60, nvml=ContainerGPU(), rss=lambda: 1, reserved=lambda: None)
    blind.start()
    assert blind.stop()["gpu_process_memory_source"] is None and blind.latest().gpu_process_memory is None


def test_the_pid_match_uses_every_pid_nspid_lists():
    from raytrain.runtime.worker.memory_monitor import own_gpu_memory, own_pids

    pids = own_pids()
    assert os.getpid() in pids
    with open("/proc/self/status") as f:
        nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
    assert {int(p) for p in nspid} <= pids
    procs = [SimpleNamespace(pid=4_000_001, usedGpuMemory=900), SimpleNamespace(pid=77, usedGpuMemory=300)]
    assert own_gpu_memory(procs, {12, 77}, lambda: 5) == (300, "nvml")  # the outer namespace's PID 77
    assert own_gpu_memory(procs, {12}, lambda: 5) == (5, "torch_reserved")


def test_torch_reserved_never_initialises_cuda():
    """The fallback reads torch only where the process already initialised CUDA (no context of its own)."""
    from raytrain.runtime.worker.memory_monitor import torch_reserved

    code = "import torch; from raytrain.runtime.worker.memory_monitor import torch_reserved; " \
           "print(torch_reserved(), torch.cuda.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.split()
    assert out == ["None", "False"]
    assert torch_reserved() is None or isinstance(torch_reserved(), int)


def test_a_gpu_workers_memory_event_carries_its_own_and_the_allocators_peaks(monkeypatch, capsys):
    """The final memory event of a GPU worker: NVML's device peak, this process's peak (and how it was found),
    and torch.cuda.max_memory_allocated (what the planner's gpu_allocated estimates; the GPU suite compares
    them). torch's CUDA is faked here: only where the process initialised it is it read."""
    from raytrain.events import MEMORY, parse_line
    from raytrain.runtime.worker.reporter import Reporter

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cuda = SimpleNamespace(is_initialized=lambda: True, max_memory_allocated=lambda device=0: 4_321,
                           memory_reserved=lambda device=0: 8_000)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    rep = Reporter(rank=0, train_batch=8)
    rep.on_gpu = True
    rep.monitor = MemoryMonitor(interval=60, nvml=ContainerGPU(), rss=lambda: 1).start()
    rep.finish()
    (event,) = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == MEMORY]
    assert event["source"] == "gpu" and event["gpu_memory_peak"] > 0 and event["final"]
    assert event["gpu_process_memory_peak"] == 8_000 and event["gpu_process_memory_source"] == "torch_reserved"
    assert event["torch_max_allocated"] == 4_321
