"""Render a job's log as it arrives: log lines above, a live progress line (step, loss, throughput)."""
from __future__ import annotations

import collections
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from raytrain import events
from raytrain.log_filter import LogFilter, split_prefix, wants_color


def gb(nbytes: float) -> str:
    """GB with two decimals; below 0.1 GB in MB (a small model's states are not "0.00 GB")."""
    if nbytes >= 1e8:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e6:.2f} MB"


def memory_summary(facts: events.JobFacts) -> list[str]:
    """Per-worker peak memory against the planner's estimate, one line each."""
    if not facts.memory:
        return []
    lines = []
    gpu = any(m.get("gpu_memory_peak") for m in facts.memory.values())
    key, what = ("gpu_memory_peak", "peak GPU memory") if gpu else ("rss_peak", "peak RSS (CPU workers)")
    peaks = ", ".join(
        f"rank {rank} {gb(m[key])}" for rank, m in sorted(facts.memory.items()) if m.get(key)
    )
    lines.append(f"{what}: {peaks}")
    if facts.estimate:
        e = facts.estimate
        trainable = e.get("trainable")
        frozen = f", {trainable:,} trainable" if isinstance(trainable, int) and trainable < e["params"] else ""
        if gpu:
            lines.append(
                f"planner estimate per GPU: {gb(e['gpu_total'])} (model states {gb(e['model_states'])}, "
                f"{e['params']:,} parameters{frozen}; activations not included)"
            )
        else:  # no CUDA context or allocator reserve on a CPU worker, and the process's own RSS is not modelled
            lines.append(
                f"planner estimate per worker: {gb(e.get('gpu_allocated') or e['gpu_total'])} of training state "
                f"(model states {gb(e['model_states'])}, {e['params']:,} parameters{frozen}; activations and the "
                "process itself not included)"
            )
    return lines


def describe_preflight(event: dict) -> list[str]:
    """Where the workers run and which interface they use, one line per node."""
    nodes: dict[str, list[dict]] = {}
    for w in event.get("workers") or []:
        nodes.setdefault(f"{w.get('host')} ({w.get('ip')})", []).append(w)
    iface = event.get("interface")
    head = (
        f"preflight ok in {event.get('seconds', 0):.2f} s: {sum(map(len, nodes.values()))} worker(s) on "
        f"{len(nodes)} node(s), rank 0 at {event.get('master')}"
        + (f", GLOO/NCCL_SOCKET_IFNAME={iface} ({event.get('reason')})" if iface else f" ({event.get('reason')})")
    )
    allocators: dict[str, list[str]] = {}
    for w in event.get("workers") or []:
        if w.get("allocator"):
            allocators.setdefault(w["allocator"], []).append(str(w.get("rank")))
    if len(allocators) == 1:
        head += f"; malloc: {next(iter(allocators))}"
    elif allocators:
        head += "; malloc: " + ", ".join(f"{name} on rank(s) {','.join(r)}" for name, r in allocators.items())
    lines = [head]
    if len(nodes) > 1:
        for where, workers in nodes.items():
            ranks = ",".join(str(w.get("rank")) for w in workers)
            gpus = sum(len(w.get("gpus") or []) for w in workers)
            lines.append(f"  {where}: rank(s) {ranks}, {gpus} GPU(s), via {workers[0].get('interface') or '?'}")
    return lines


def describe_resize(event: dict) -> str:
    return (
        f"elastic: running on {event.get('workers')} worker(s) (range {event.get('range')}); grad-accum "
        f"{event.get('grad_accum')} (planned {event.get('planned_grad_accum')} on {event.get('planned_workers')}) "
        f"keeps the global batch {event.get('train_batch')}"
    )


SHOWN = ("event", "step", "total_steps", "loss", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu",
         "data_wait_s", "step_time_s", "elapsed_s", "wall_time", "loss_scale", "skipped_steps")


def _number(m: dict, key: str) -> float | None:
    value = m.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def describe_metrics(m: dict) -> str:
    total = _number(m, "total_steps")
    parts = [f"step {m.get('step', '?')}" + (f"/{int(total)}" if total else "")]
    if _number(m, "loss") is not None:
        parts.append(f"loss {m['loss']:.4f}")
    if _number(m, "samples_per_s") is not None:
        parts.append(f"{m['samples_per_s']:.1f} samples/s")
    if _number(m, "tokens_per_s") is not None:
        parts.append(f"{m['tokens_per_s']:,.0f} tokens/s")
    if _number(m, "tflops_per_gpu") is not None:  # GPU workers only (the worker derives it only there)
        parts.append(f"{m['tflops_per_gpu']:.1f} TFLOP/s per GPU")
    if _number(m, "mfu") is not None:
        parts.append(f"MFU {m['mfu'] * 100:.1f}%")
    if _number(m, "step_time_s") is not None:
        parts.append(f"{m['step_time_s'] * 1000:.0f} ms/step")
    if isinstance(m.get("data_wait_s"), (int, float)):
        parts.append(f"data wait {m['data_wait_s'] * 1000:.0f} ms/step")
    if _number(m, "loss_scale") is not None:  # fp16's dynamic loss scaling (reporter.loss_scaling)
        skipped = _number(m, "skipped_steps")
        parts.append(f"loss scale {m['loss_scale']:g}" + (f" ({int(skipped)} step(s) skipped on overflow)" if skipped else ""))
    for key, value in m.items():
        if key in SHOWN or key.endswith("_gb"):
            continue
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        elif isinstance(value, (int, str)) and len(str(value)) < 24:
            parts.append(f"{key} {value}")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def describe_eta(facts: events.JobFacts, width: int = 20) -> str:
    """A bar and the time left, when the job gave its length (total_steps); else "". The pace is the mean step
    time of the last (up to) 10 reports."""
    last = facts.last_metrics or {}
    total, step = _number(last, "total_steps"), _number(last, "step")
    if not total or step is None:
        return ""
    done = min(max(step / total, 0.0), 1.0)
    bar = "#" * round(done * width) + "." * (width - round(done * width))
    times = [m["step_time_s"] for m in facts.metrics[-10:] if _number(m, "step_time_s")]
    eta = f"  ETA {_clock((total - step) * sum(times) / len(times))}" if times and step < total else ""
    return f"[{bar}] {done * 100:3.0f}%{eta}"


def describe_stragglers(facts: events.JobFacts) -> str:
    """The progress line's note of the ranks that are stragglers now, e.g. ``  straggler: rank 1 (10.0.0.2) 2.0x``."""
    if not facts.stragglers:
        return ""
    return "  straggler: " + ", ".join(
        f"rank {rank}" + (f" ({e['node']})" if e.get("node") else "") + (f" {e['ratio']}x" if e.get("ratio") else "")
        for rank, e in sorted(facts.stragglers.items()))


def describe_ending(event: dict) -> str:
    """The line that says how a job ended, from its finished/error/capacity/invalid/stopped event."""
    kind = event.get("event")
    if kind == events.STOPPED:
        return f"raytrain: stopped ({event.get('signal') or 'a signal'}: `raytrain jobs stop`, or its cluster stopping)"
    if kind == events.FINISHED:
        checkpoint = event.get("checkpoint")
        return "raytrain: training finished" + (f"; last checkpoint {checkpoint}" if checkpoint else "")
    if kind == events.ERROR:
        where = f" on rank {event['rank']}" if event.get("rank") is not None else ""
        return f"raytrain: training failed{where}: {event.get('type', 'Error')}: {event.get('message', '')}"
    return f"raytrain: error: {event.get('message', '')}"


class RecentLines:
    """The last ``size`` lines a follow printed, without ANSI codes or Ray's ``(pid=..)`` prefix; ``in`` asks
    whether a line (as a rank's own log has it) was among them."""

    def __init__(self, size: int = 500):
        self._lines: collections.deque[str] = collections.deque(maxlen=size)

    def add(self, line: str) -> None:
        self._lines.append(split_prefix(line)[1].rstrip())

    def __contains__(self, line: object) -> bool:
        return line in self._lines  # asked a few times, once, when a job has failed


class ProgressPrinter:
    """Feed it log text (``on_text``); it prints log lines and keeps one live progress line."""

    def __init__(self, console: Console | None = None, *, show_logs: bool = True, verbose: bool = False,
                 live: bool = True, endings: bool = False):
        """``live``: on a terminal, one updating progress line instead of a line per step; ``endings``: also
        say how the job ended (`jobs logs`; `submit` says it itself)."""
        self.console = console or Console(stderr=False)
        self.show_logs = show_logs
        self.live = live
        self.endings = endings
        self._ending: str | None = None
        self.filter = LogFilter(color=wants_color(self.console.is_terminal), verbose=verbose)
        self.facts = events.JobFacts()
        self.shown = RecentLines()  # what of the log it printed (a failure's summary leaves those lines out)
        self._partial = ""
        self._started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> "ProgressPrinter":
        if self.console.is_terminal and self.live:
            self._live = Live(self._status(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        if self._ending is not None:
            self.console.print(self._ending, markup=False, highlight=False, soft_wrap=True)
            self._ending = None
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def _status(self) -> Text:
        elapsed = time.monotonic() - self._started
        last = self.facts.last_metrics
        state = "waiting for workers" if self.facts.started is None else "training"
        body = describe_metrics(last) if last else state
        eta = describe_eta(self.facts)
        if eta:
            body = f"{eta}  {body}"
        peak = self.facts.peak_memory()
        if peak:
            key = "gpu_memory_peak" if peak[0] == "gpu" else "rss_peak"
            per_rank = "/".join(
                f"{m[key] / 1e9:.2f}" for _, m in sorted(self.facts.memory.items()) if m.get(key)
            )
            body += f"  {'GPU mem' if peak[0] == 'gpu' else 'RSS'} peak {per_rank} GB (per worker)"
        return Text(f"[{elapsed:5.0f}s] {body}{describe_stragglers(self.facts)}", style="bold cyan")

    def on_text(self, text: str) -> None:
        text = self._partial + text
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        if self._live is not None:
            self._live.update(self._status())

    def _line(self, line: str) -> None:
        found = events.parse_events(line)
        if not found:
            shown = self.filter(line) if self.show_logs and line.strip() else None
            if shown is not None:
                self.console.print(Text.from_ansi(shown) if self.filter.color else shown,
                                   markup=False, highlight=False, soft_wrap=True)
                self.shown.add(shown)
            return
        for event in found:
            self._event(event)

    def _event(self, event: dict) -> None:
        self.facts.add(event)
        kind = event.get("event")
        if kind == events.METRICS and self._live is None:
            eta = describe_eta(self.facts).partition("ETA ")[2]
            line = describe_metrics(event) + (f"  ETA {eta}" if eta else "") + describe_stragglers(self.facts)
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif kind == events.STARTED:
            self.console.print(
                f"raytrain: training {event.get('name')} on {event.get('workers')} worker(s), "
                f"ZeRO-{event.get('zero')}, {event.get('precision')}, global batch {event.get('train_batch')}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            if (event.get("storage_nodes") or 0) > 1:
                self.console.print(
                    f"raytrain: storage {event.get('storage')}: every node ({event['storage_nodes']}) wrote a "
                    "marker the driver read back (shared)",
                    markup=False, highlight=False, soft_wrap=True,
                )
        elif kind == events.WAITING:
            self.console.print(f"raytrain: pending: {event.get('message', '')}", markup=False, highlight=False,
                               soft_wrap=True)
        elif kind == events.CLEANED and event.get("groups"):
            self.console.print(f"raytrain: removed {len(event['groups'])} placement group(s) that ended jobs "
                               "leaked", markup=False, highlight=False, soft_wrap=True)
        elif kind == events.HANG:
            self.console.print(f"raytrain: hung: no step finished for {event.get('idle_s', 0):.0f} s "
                               f"(hang timeout {event.get('timeout_s', 0):.0f} s); {event.get('action', '')}:",
                               markup=False, highlight=False, soft_wrap=True)
            for line in event.get("lines") or []:
                self.console.print(f"raytrain:   {line}", markup=False, highlight=False, soft_wrap=True)
        elif kind == events.RESTARTING:
            self.console.print(f"raytrain: workers restarting: {event.get('reason', '')}", markup=False, highlight=False,
                               soft_wrap=True)
        elif kind == events.PREFLIGHT:
            for line in describe_preflight(event):
                self.console.print(f"raytrain: {line}", markup=False, highlight=False, soft_wrap=True)
        elif kind == events.RESIZED:
            self.console.print(f"raytrain: {describe_resize(event)}", markup=False, highlight=False, soft_wrap=True)
        elif kind in (events.STRAGGLER, events.SKIPPED, events.REFUSED, events.ROLLBACK, events.PREEMPTED):
            self.console.print(f"raytrain: {event.get('message', '')}", markup=False, highlight=False, soft_wrap=True)
        elif self.endings and kind in (events.FINISHED, events.ERROR, events.CAPACITY, events.INVALID, events.STOPPED):
            self._ending = describe_ending(event)  # said last: workers' lines can reach the log after it
