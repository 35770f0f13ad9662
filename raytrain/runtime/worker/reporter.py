"""``ctx.report``'s side on a worker: each step's metrics (as floats, with throughput and timing derived from
the global batch, and the memory sampler's readings) to the job's event log on rank 0, and every worker's
peak-memory events. Never calls Ray Train: metrics cost the step microseconds."""
from __future__ import annotations

import time
from typing import Any

from raytrain import events
from raytrain.runtime.worker import heartbeat

MEMORY_EVENT_EVERY_S = 10.0
# How often each worker samples its memory and GPU use (progress, `jobs status`): a read of /proc or NVML in a
# background thread, fine-grained enough to catch a step's peak at no cost to the step. 0: no sampler (tests).
MONITOR_INTERVAL_S = 1.0


def as_float(value: Any) -> Any:
    """A tensor or numpy scalar as a float (JSON-ready); anything else unchanged."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


def loss_scaling(engine: Any) -> dict[str, Any]:
    """fp16 dynamic loss scaling's state on a DeepSpeed engine: ``loss_scale`` (the current scale) and
    ``skipped_steps`` (optimizer steps skipped on a gradient overflow so far); empty for an engine without fp16
    (bf16 and fp32 need no scaling) or anything that is not an engine. Attribute reads only: no sync.

    No blanket ``except``: the names read here are DeepSpeed's (tests/unit/test_library_names.py checks they
    exist in the installed version), and an engine whose optimizer raises on ``loss_scale`` is a bug to see,
    not a report to thin out silently."""
    fp16_enabled = getattr(engine, "fp16_enabled", None)
    if not (callable(fp16_enabled) and fp16_enabled()):
        return {}
    out: dict[str, Any] = {}
    skipped = getattr(engine, "skipped_steps", None)
    if isinstance(skipped, int):
        out["skipped_steps"] = skipped
    optimizer = getattr(engine, "optimizer", None)
    # ZeRO / FP16 optimizers' property; read it only where it is defined, since getattr with a default would
    # also swallow an AttributeError raised inside the property.
    defined = any("loss_scale" in vars(k) for k in type(optimizer).__mro__) or \
        "loss_scale" in getattr(optimizer, "__dict__", {})
    scale = optimizer.loss_scale if defined else None
    if isinstance(scale, (int, float)):
        out["loss_scale"] = float(scale)
    return out


class Reporter:
    """Step accounting and event lines for one worker. ``train_batch``: the global batch (samples per step)."""

    def __init__(self, *, rank: int, train_batch: int):
        self.rank = rank
        self.train_batch = train_batch
        self.monitor = None  # a MemoryMonitor, once start_monitor ran
        self.trackers = None  # rank 0's raytrain.runtime.tracking.trackers.Trackers (--track), fed each report
        self.goodput = None  # rank 0's raytrain.goodput.Feed: the trackers get the run's goodput so far
        self.total_steps: int | None = None  # the run's length (ctx.total_steps): the progress bar and ETA
        self.tokens_per_sample: float | None = None  # ctx.tokens_per_sample: tokens/s
        self.flops_per_sample: float | None = None  # ctx.flops_per_sample: TFLOP/s and MFU on GPU workers
        self.world_size = 1
        self.on_gpu = False
        self.gpu_peak_tflops: float | None = None
        self.last_metrics: dict[str, Any] = {}
        self._reports = 0
        self._last_step = 0
        self._started = self._last_time = time.perf_counter()
        self._last_memory_event = 0.0

    def start_monitor(self, interval: float, *, gpu: bool) -> None:
        """Sample this worker's GPU (NVML) or RSS (CPU workers) in a background thread."""
        from raytrain.runtime.worker.memory_monitor import MemoryMonitor

        self.monitor = MemoryMonitor(interval=interval, gpu=gpu).start()

    def restart_clock(self, step: int) -> None:
        """Count throughput from ``step`` and now (training starts after set-up the first report must not
        include)."""
        self._last_step, self._last_time = step, time.perf_counter()

    def resume_at(self, step: int) -> None:
        """Count throughput from ``step`` (a restored run's first report covers the steps after it)."""
        self._last_step = step

    def step_metrics(
        self, metrics: dict[str, Any], *, engine_step: int | None = None, data_wait_s: float | None = None
    ) -> dict[str, Any]:
        """``metrics`` as floats plus ``step`` (given, else ``engine_step``, else the count of reports),
        ``samples_per_s`` and ``step_time_s`` (over the steps since the last report), ``elapsed_s``,
        ``wall_time`` and the memory sampler's readings; a key the job gave is kept as given."""
        clean = {k: as_float(v) for k, v in metrics.items()}
        self._reports += 1
        step = clean.get("step")
        if step is None:
            step = engine_step or self._reports
            clean["step"] = step
        now = time.perf_counter()
        steps_done = max(int(step) - self._last_step, 0)
        dt = now - self._last_time
        if steps_done and dt > 0:
            clean.setdefault("samples_per_s", round(steps_done * self.train_batch / dt, 3))
            clean.setdefault("step_time_s", round(dt / steps_done, 4))
        if data_wait_s is not None:  # seconds per step the job waited for ctx.dataset's next batch
            clean.setdefault("data_wait_s", round(data_wait_s / max(steps_done, 1), 5))
        self._last_time, self._last_step = now, int(step)
        from raytrain.runtime.worker.throughput import derived

        for key, value in derived(clean, tokens_per_sample=self.tokens_per_sample,
                                  flops_per_sample=self.flops_per_sample, world_size=self.world_size,
                                  gpu_peak_tflops=self.gpu_peak_tflops, on_gpu=self.on_gpu).items():
            clean.setdefault(key, value)
        if self.total_steps:
            clean.setdefault("total_steps", int(self.total_steps))
        clean.setdefault("elapsed_s", round(now - self._started, 3))
        clean.setdefault("wall_time", round(time.time(), 3))
        if self.monitor is not None:
            for key, value in self.monitor.metrics().items():
                clean.setdefault(key, value)
        self.last_metrics = clean
        return clean

    def report(
        self, metrics: dict[str, Any], *, engine_step: int | None = None, data_wait_s: float | None = None,
        engine: Any = None,
    ) -> dict[str, Any]:
        """One step's report: the metrics event (rank 0) and, at most every 10 s, a memory event. Returns the
        metrics as emitted. ``engine``: an fp16 engine's loss scale and skipped steps join the metrics."""
        clean = self.step_metrics(metrics, engine_step=engine_step, data_wait_s=data_wait_s)
        heartbeat.STATE.step_finished(int(clean["step"]))
        for key, value in loss_scaling(engine).items():
            clean.setdefault(key, value)
        if self.rank == 0:
            events.emit(events.METRICS, **clean)
            if self.trackers is not None:
                self.trackers.report({**clean, **(self.goodput.update(clean) if self.goodput else {})})
        self.memory_event()
        return clean

    def memory_event(self, final: bool = False) -> None:
        if self.monitor is None:
            return
        now = time.monotonic()
        if not final and now - self._last_memory_event < MEMORY_EVENT_EVERY_S:
            return
        self._last_memory_event = now
        peak = self.monitor.peak()
        from raytrain.runtime.worker.memory_monitor import torch_max_allocated

        allocated = torch_max_allocated() if self.on_gpu else None
        events.emit(
            events.MEMORY,
            rank=self.rank,
            source=peak["source"],
            rss_peak=peak["rss_peak"],
            gpu_memory_peak=peak["gpu_memory_used_peak"],
            **({"gpu_process_memory_peak": peak["gpu_process_memory_peak"],
                "gpu_process_memory_source": peak["gpu_process_memory_source"]}
               if peak.get("gpu_process_memory_peak") is not None else {}),
            **({"torch_max_allocated": allocated} if allocated is not None else {}),
            final=final,
            **({"sampler_error": peak["error"], "sampler_errors": peak["errors"]} if peak.get("error") else {}),
        )

    def finish(self) -> None:
        """Stop the sampler and emit this worker's final peak memory."""
        if self.monitor is not None:
            self.monitor.stop()
            self.memory_event(final=True)
        if self.trackers is not None:
            last = self.last_metrics
            self.trackers.finish({
                "steps": last.get("step"), "final_loss": last.get("loss"), "elapsed_s": last.get("elapsed_s"),
            })
