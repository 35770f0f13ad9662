"""bench/overhead.py --guards-ab --same-processes: every guard on vs off in the same two processes.

Two CPU processes (gloo, as raytrain's CPU workers) each build two DeepSpeed engines (raytrain's
``build_engine``, ZeRO --zero, fp32) over the same MLP: one as raytrain builds it (the non-finite guard
installed, ``heartbeat.instrument``'s phase marks), one without either. An "on" round also has the straggler
watch's compute timing (``Work.wait`` timed, ``STATE.step_finished`` per step) and a beat thread that every
heartbeat.BEAT_S snapshots the state and runs the straggler rule on it (in a raytrain job the board and the
watchdog are other processes: this is an upper bound); an "off" round puts torch's own ``Work.wait`` back and
the beat thread idles.

Two figures:

- the A/B: many short rounds in pairs (off on, on off, ...: the order alternates), each pair's ratio of
  median step times, and the median of those ratios with a 95 % confidence interval (order statistics of the
  pairs, no distribution assumed). Pairs a few steps long keep load that drifts over seconds out of a ratio;
  the whole measurement runs twice, building the plain engine first and then the guarded one first, so that
  neither side keeps the better memory layout.
- the guards' own seconds per step, timed inside the guarded engine's steps: the non-finite guard (its
  wrappers of ``backward`` and ``_take_model_step`` less what they wrap; its all-reduce separately, which
  includes waiting for the other rank), the phase marks (likewise), ``step_finished``, the timed waits (how
  many per step x the wrapper's own cost per call, measured here on a finished Work) and the beat thread's CPU
  time. Their sum over the off side's step time resolves far below what the A/B can on a loaded machine.

``same_engine`` (``--same-engine``): the two engines' memory layouts and build order move the A/B by a few
per cent either way, more than the guards cost. Instead each process builds one engine (no guard), records
what installing the guard and the phase marks changes on it (:class:`Toggle`: the engine's instance attributes
and the marks' forward pre-hook) and alternates the rounds on that engine: an "off" round takes those changes
off (the class's own ``backward``, ``_take_model_step`` and ``step``, no hook), an "on" round puts them back;
the timed waits and the beat thread toggle as above. With one engine there is no build order: the measurement
runs once (``orders``: ``same-engine``). Before the rounds each rank checks the toggle (``toggle_check``): off
is the plain engine, and on, a step with a NaN loss is skipped. The own-time figures are timed as above: the
timers are part of what an "on" round puts back.

``only`` (``--guards-only``): the "on" engine and rounds get one component (``nonfinite``: the guard;
``marks``: the phase marks; ``timing``: the timed waits and ``step_finished``; ``beat``: the beat thread), all
of them (``all``) or none (``none``: two plain engines, or with ``same_engine`` nothing toggled on the
engine: the A/B's null), and nothing times the guards from inside (the timers' own cost stays out of the A/B);
no own-time figures then.

Prints nothing; ``measure`` returns the figures.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WARMUP_PAIRS = 3
SAME_ENGINE = "same-engine"  # the "order" of --same-engine: one engine, the guards toggled on it
COMPONENTS = ("nonfinite", "marks", "timing", "beat")


class Clock:
    """Wall and CPU (this thread's) seconds of the wrapped callables, by name: the guard timing's instrument."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def wrap(self, name: str, fn):  # type: ignore[no-untyped-def]
        clock, cpu_clock, s, cpu, n = time.perf_counter, time.thread_time, self.s, self.cpu, self.n
        s[name], cpu[name], n[name] = 0.0, 0.0, 0

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            c, t = cpu_clock(), clock()
            try:
                return fn(*args, **kwargs)
            finally:
                s[name] += clock() - t
                cpu[name] += cpu_clock() - c
                n[name] += 1
        return timed

    def reset(self) -> None:
        for k in self.s:
            self.s[k], self.cpu[k], self.n[k] = 0.0, 0.0, 0

    def parts(self, d: dict[str, float]) -> dict[str, float]:
        """The guards' own seconds so far (outer less inner wrappers), by part."""
        return {"nonfinite": (d["guarded_backward"] - d["backward"]) + (d["guarded_take_step"] - d["take_step"]),
                "agree": d["agree"],
                "marks": (d["marked_backward"] - d["guarded_backward"]) + (d["marked_step"] - d["step"]) + d["enter"],
                "step_finished": d["step_finished"]}


def _hook_dicts(engine) -> dict[tuple[int, str], dict]:  # type: ignore[no-untyped-def]
    """Every hook dict of the engine and its submodules (``_forward_pre_hooks``, ...), by (module id, name)."""
    return {(id(m), name): d for m in engine.modules() for name, d in vars(m).items()
            if "hooks" in name and isinstance(d, dict)}


class Toggle:
    """``--same-engine``: what ``install()`` changes on ``engine`` (the guard, the phase marks), recorded once and
    then taken off and put back between rounds.

    Recorded as a diff around ``install()``: the engine's instance attributes it set or replaced (``backward``,
    ``_take_model_step``, ``step``, ``_raytrain_guard``) and the hooks it added to any module's hook dicts (the
    phase marks' forward pre-hook). ``heartbeat.instrument`` keeps no handle to its hook, so the hook is removed
    and re-registered under its own id in the same dict (what ``RemovableHandle.remove`` deletes), not wrapped
    in a switch: an off round's engine has no hook at all and takes torch's hook-free call path, as a plain
    engine does. The attributes are written to ``__dict__`` directly, past ``nn.Module.__setattr__``."""

    def __init__(self, engine, install) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine
        before = dict(vars(engine))
        hooks_before = {k: dict(d) for k, d in _hook_dicts(engine).items()}
        install()
        after = vars(engine)
        gone = set(before) - set(after)
        assert not gone, f"install removed engine attributes: {sorted(gone)}"
        self.saved = {k: before[k] for k in after if k in before and before[k] is not after[k]}
        self.added = {k: after[k] for k in after if k not in before or before[k] is not after[k]}
        self.hooks: list[tuple[str, dict, dict]] = []  # (the dict's name, the module's dict, {id: hook} added)
        for key, d in _hook_dicts(engine).items():
            old = hooks_before.get(key, {})
            assert set(old) <= set(d), "install removed a hook"
            new = {h: d[h] for h in d if h not in old}
            if new:
                self.hooks.append((key[1], d, new))
        self.is_on = True

    def off(self) -> None:
        if not self.is_on:
            return
        d = vars(self.engine)
        for k in self.added:
            if k in self.saved:
                d[k] = self.saved[k]
            else:
                del d[k]
        for _, hooks, added in self.hooks:
            for h in added:
                del hooks[h]
        self.is_on = False

    def on(self) -> None:
        if self.is_on:
            return
        vars(self.engine).update(self.added)
        for _, hooks, added in self.hooks:
            hooks.update(added)
        self.is_on = True

    def is_plain(self) -> bool:
        """Off: every recorded attribute is the class's own again (or its value from before install), every
        recorded hook gone."""
        d = vars(self.engine)
        attrs = all(d[k] is self.saved[k] if k in self.saved else k not in d for k in self.added)
        return attrs and not any(set(added) & set(hooks) for _, hooks, added in self.hooks)

    def names(self) -> dict[str, list]:
        return {"attributes": sorted(self.added), "hooks": sorted(name for name, _, added in self.hooks for _ in added)}


def toggle_check(toggle: Toggle, x, y, nonfinite: bool) -> dict:  # type: ignore[no-untyped-def]
    """Before the rounds (every rank): off leaves the class's own methods and no recorded hook; on, with the
    guard among the components, a step with a NaN loss is skipped (the weights stay). Raises if not."""
    import logging

    import torch

    from raytrain.runtime.worker import guard

    engine = toggle.engine
    toggle.off()
    own = all(name not in vars(engine) for name in ("backward", "_take_model_step", "step", "_raytrain_guard"))
    assert own and toggle.is_plain(), f"the off engine is not the plain one: {toggle.names()}"
    toggle.on()
    assert not (toggle.added or toggle.hooks) or not toggle.is_plain()
    out: dict = {**toggle.names(), "off_is_plain": True, "nan_step_skipped": None}
    if nonfinite:
        g = engine._raytrain_guard
        emit, g.emit = g.emit, lambda *args, **kwargs: None  # no skip event line in the bench's output
        ds_log = logging.getLogger("DeepSpeed")  # nor DeepSpeed's overflow warning
        level = ds_log.level
        ds_log.setLevel(logging.ERROR)
        try:
            weights = [t.detach().clone() for t in guard._local_tensors(engine)]
            skipped = len(g.skipped)
            loss = ((engine(x) - y) ** 2).mean() * float("nan")
            engine.backward(loss)
            engine.step()
        finally:
            g.emit = emit
            ds_log.setLevel(level)
        kept = all(torch.equal(a, b.detach()) for a, b in zip(weights, guard._local_tensors(engine)))
        assert len(g.skipped) == skipped + 1 and kept, "the toggled-on guard did not skip a NaN loss's step"
        out["nan_step_skipped"] = True
    return out


def worker(rank: int, a: dict, port: int, out: str) -> None:
    import warnings

    # As raytrain's workers (runtime/worker/loop.py): DeepSpeed's deprecated torch.distributed calls, each step.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.distributed_c10d import Work

    from raytrain import straggler
    from raytrain.runtime.worker import collective_time, guard, heartbeat
    from raytrain.runtime.worker.engine import build_engine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dim, layers, batch = a["dim"], a["layers"], a["batch"]

    def model():
        torch.manual_seed(0)
        blocks = [m for _ in range(layers) for m in (nn.Linear(dim, dim), nn.GELU())]
        return nn.Sequential(*blocks, nn.Linear(dim, 1))

    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": a["zero"]}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}
    clock = Clock()
    only = a.get("only")
    timed = only is None  # the guards' own time, timed from inside: only with every component on
    on_parts = set(COMPONENTS) if only in (None, "all") else ({only} if only in COMPONENTS else set())

    def build():
        install = guard.install
        guard.install = lambda engine, **kw: None
        try:
            return build_engine(model(), optimizer=lambda p: torch.optim.AdamW(list(p), lr=1e-4), config=config,
                                lr_scheduler=None, model_parameters=None)
        finally:
            guard.install = install

    def install(built) -> None:
        if not timed:
            if "nonfinite" in on_parts:
                guard.install(built)
            if "marks" in on_parts:
                heartbeat.instrument(built)
            return
        # The guard as build_engine installs it, between two timers: outer - inner = the guard's own seconds.
        built.backward = clock.wrap("backward", built.backward)
        built._take_model_step = clock.wrap("take_step", built._take_model_step)
        g = guard.install(built)
        g.agree = clock.wrap("agree", g.agree)
        built.backward = clock.wrap("guarded_backward", built.backward)
        built._take_model_step = clock.wrap("guarded_take_step", built._take_model_step)
        built.step = clock.wrap("step", built.step)
        heartbeat.instrument(built)
        built.backward = clock.wrap("marked_backward", built.backward)
        built.step = clock.wrap("marked_step", built.step)

    toggle = None
    if a["order"] == SAME_ENGINE:
        plain = guarded = build()
        toggle = Toggle(plain, lambda: install(plain))
    elif a["order"] == "plain-first":
        plain = build()
        guarded = build()
        install(guarded)
    else:
        guarded = build()
        install(guarded)
        plain = build()
    if timed:
        heartbeat.State.enter = clock.wrap("enter", heartbeat.State.enter)  # the forward hook's phase mark
        step_finished = clock.wrap("step_finished", heartbeat.State.step_finished)
    else:
        step_finished = heartbeat.State.step_finished

    torch_wait = Work.wait
    collective_time.install()
    timed_wait = Work.wait
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, dim, generator=g), torch.randn(batch, 1, generator=g)
    step_no = [0]
    cpu_per_step: dict[bool, list[float]] = {True: [], False: []}  # this process's CPU (all threads), by round
    record, per_step = [False], {"wall": [], "cpu": []}  # the guards' own seconds of each measured on-step

    beating, stop, beat_cpu = threading.Event(), threading.Event(), [0.0]
    detector = straggler.Detector()

    def beat() -> None:
        while not stop.wait(heartbeat.BEAT_S):
            if beating.is_set():
                t = time.thread_time()
                snap = heartbeat.STATE.snapshot()
                detector.update([{**snap, "rank": 0}, {**snap, "rank": 1}])
                beat_cpu[0] += time.thread_time() - t

    threading.Thread(target=beat, daemon=True).start()

    def run(on: bool, steps: int) -> list[float]:
        timing_on = on and "timing" in on_parts
        Work.wait = timed_wait if timing_on else torch_wait
        heartbeat.STATE.timing = timing_on
        (beating.set if on and "beat" in on_parts else beating.clear)()
        if toggle is not None:
            (toggle.on if on else toggle.off)()
        eng = guarded if on else plain
        dist.barrier()
        times, process0 = [], time.process_time()
        for _ in range(steps):
            if on and timed:
                wall0, cpu0 = clock.parts(clock.s), clock.parts(clock.cpu)
            t = time.perf_counter()
            loss = ((eng(x) - y) ** 2).mean()
            eng.backward(loss)
            eng.step()
            step_no[0] += 1
            if timing_on:
                step_finished(heartbeat.STATE, step_no[0])
            times.append(time.perf_counter() - t)
            if on and timed and record[0]:
                for name, now, before in (("wall", clock.parts(clock.s), wall0), ("cpu", clock.parts(clock.cpu), cpu0)):
                    per_step[name].append({k: now[k] - before[k] for k in now})
        beating.clear()
        cpu_per_step[on].append((time.process_time() - process0) / steps)
        return times

    check = None if toggle is None else toggle_check(toggle, x, y, "nonfinite" in on_parts)
    steps = a["steps"]
    for _ in range(WARMUP_PAIRS):  # not counted
        run(True, steps), run(False, steps)
    cpu_per_step[True].clear(), cpu_per_step[False].clear()
    if not timed:
        on_times, off_times = [], []
        for r in range(a["rounds"]):
            for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
                (on_times if side == "on" else off_times).append(run(side == "on", steps))
        stop.set()
        Work.wait = torch_wait
        Path(f"{out}.{rank}").write_text(json.dumps({"on": on_times, "off": off_times, "timing": None,
                                                     "cpu_on": cpu_per_step[True], "cpu_off": cpu_per_step[False],
                                                     "toggle_check": check}))
        dist.destroy_process_group()
        return

    # Timed waits per step: counted in a round of their own (the count is not timed).
    counted = [0]

    def counting_wait(self, *args, _timed=timed_wait, **kwargs):  # type: ignore[no-untyped-def]
        counted[0] += 1
        return _timed(self, *args, **kwargs)

    Work.wait, saved = counting_wait, timed_wait
    timed_wait = counting_wait
    run(True, steps)
    timed_wait = saved
    waits_per_step = counted[0] / steps

    # The wrapper's own cost per wait, on a finished Work (the wait itself returns at once).
    work = dist.all_reduce(torch.zeros(1), async_op=True)
    torch_wait(work)
    calls = 20000
    per_call = {}
    for name, fn in (("torch", torch_wait), ("timed", timed_wait)):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                fn(work)
            best = min(best, (time.perf_counter() - t) / calls)
        per_call[name] = best
    wait_overhead_s = max(per_call["timed"] - per_call["torch"], 0.0)

    clock.reset()
    cpu_per_step[True].clear(), cpu_per_step[False].clear()  # the counting round is not a pair's
    beat_cpu[0] = 0.0
    record[0] = True
    on_times: list[list[float]] = []
    off_times: list[list[float]] = []
    for r in range(a["rounds"]):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            (on_times if side == "on" else off_times).append(run(side == "on", steps))
    stop.set()
    Work.wait = torch_wait
    on_steps = a["rounds"] * steps
    s = clock.s
    timing = {
        "steps": on_steps,
        # medians over the measured on-steps of each part (wall: includes being descheduled; cpu: this thread's)
        **{f"{part}_{kind}_s": statistics.median(p[part] for p in per_step[kind])
           for kind in ("wall", "cpu") for part in ("nonfinite", "agree", "marks", "step_finished")},
        "total_wall_s": statistics.median(sum(p.values()) - p["agree"] for p in per_step["wall"]),
        "total_cpu_s": statistics.median(sum(p.values()) - p["agree"] for p in per_step["cpu"]),
        "mean_wall_s": {k: v / on_steps for k, v in clock.parts(clock.s).items()},
        "waits_per_step": waits_per_step,
        "wait_overhead_s": wait_overhead_s,
        "beat_cpu_s": beat_cpu[0] / on_steps,
        "enter_calls": clock.n["enter"],
    }
    Path(f"{out}.{rank}").write_text(json.dumps({"on": on_times, "off": off_times, "timing": timing,
                                                 "cpu_on": cpu_per_step[True], "cpu_off": cpu_per_step[False],
                                                 "toggle_check": check}))
    dist.destroy_process_group()


def median_ci(values: list[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval of the median: order statistics k and n-k+1 with
    P(Binomial(n, 1/2) < k) <= (1 - level) / 2. (None, None) for too few values."""
    xs, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while True:
        p = math.comb(n, k) / 2 ** n
        if tail + p > (1 - level) / 2:
            break
        tail += p
        k += 1
    if k == 0:
        return None, None
    return xs[k - 1], xs[n - k]


def measure(*, zero: int, steps: int, rounds: int, dim: int, layers: int, batch: int,
            orders: tuple[str, ...] = ("plain-first", "guarded-first"), only: str | None = None,
            same_engine: bool = False) -> dict:
    import socket
    import tempfile

    import torch.multiprocessing as mp

    if same_engine:  # one engine: no build order to repeat
        orders = (SAME_ENGINE,)
    pairs, on_all, off_all, timings, by_order, cpu_pairs, cpu_off = [], [], [], [], {}, [], []
    checks = []
    for order in orders:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        a = {"zero": zero, "steps": steps, "rounds": rounds, "dim": dim, "layers": layers, "batch": batch,
             "order": order, "only": only}
        with tempfile.TemporaryDirectory() as folder:
            out = str(Path(folder) / "result.json")
            mp.spawn(worker, args=(a, port, out), nprocs=2, join=True)
            ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
        r0 = ranks[0]  # the steps are synchronous: rank 0's times are the step's
        mine = [statistics.median(on) / statistics.median(off) for on, off in zip(r0["on"], r0["off"])]
        by_order[order] = {"paired_ratio": statistics.median(mine), "pairs": len(mine),
                           "on_s": r0["on"], "off_s": r0["off"]}  # rank 0's step times, per round
        pairs += mine
        # each rank's process CPU per step (every thread), on less off, paired by round; the two ranks summed
        cpu_pairs += [sum(r["cpu_on"][i] - r["cpu_off"][i] for r in ranks) for i in range(len(r0["cpu_on"]))]
        cpu_off += [sum(r["cpu_off"][i] for r in ranks) for i in range(len(r0["cpu_off"]))]
        on_all += [t for rnd in r0["on"] for t in rnd]
        off_all += [t for rnd in r0["off"] for t in rnd]
        timings += [r["timing"] for r in ranks]
        checks += [r["toggle_check"] for r in ranks if r["toggle_check"] is not None]
    off_step = statistics.median(off_all)
    low, high = median_ci(pairs)
    common = {"zero": zero, "steps_per_round": steps, "pairs_per_order": rounds, "dim": dim, "layers": layers,
              "batch": batch, "only": only, "same_engine": same_engine, "orders": by_order,
              "toggle_check": checks or None,  # --same-engine: each rank's check of the toggle (toggle_check)
              "steady_on_s": statistics.median(on_all), "steady_off_s": off_step,
              "ratio": statistics.median(on_all) / off_step,
              "paired_ratio": statistics.median(pairs), "paired_ratio_ci95": [low, high],
              "paired_ratio_quartiles": statistics.quantiles(pairs, n=4) if len(pairs) > 1 else None,
              "round_ratios": pairs,
              # CPU seconds per step of both processes (all threads): the extra of "on", paired by round
              "cpu_extra_s": statistics.median(cpu_pairs), "cpu_extra_ci95": list(median_ci(cpu_pairs)),
              "cpu_off_s": statistics.median(cpu_off)}
    if only is not None:
        return common

    for i, t in enumerate(timings):
        t["rank"] = i % 2

    def per_step(key: str) -> float:  # the larger rank's median over both orders, in ms
        return 1000 * max(statistics.median(t[key] for t in timings if t["rank"] == r) for r in (0, 1))

    guard = {
        "nonfinite_guard_ms": per_step("nonfinite_wall_s"), "nonfinite_guard_cpu_ms": per_step("nonfinite_cpu_s"),
        "nonfinite_agree_ms": per_step("agree_wall_s"), "nonfinite_agree_cpu_ms": per_step("agree_cpu_s"),
        "phase_marks_ms": per_step("marks_wall_s"), "step_finished_ms": per_step("step_finished_wall_s"),
        "timed_waits_per_step": statistics.median(t["waits_per_step"] for t in timings),
        "wait_overhead_us": 1e6 * statistics.median(t["wait_overhead_s"] for t in timings),
        "beat_thread_ms": per_step("beat_cpu_s"),
    }
    guard["timed_waits_ms"] = guard["timed_waits_per_step"] * guard["wait_overhead_us"] / 1000
    # per step: the medians of the whole (wall and CPU), plus the parts measured apart (waits, beat thread)
    extra = guard["timed_waits_ms"] + guard["beat_thread_ms"]
    guard["total_ms"] = per_step("total_wall_s") + extra
    guard["total_cpu_ms"] = per_step("total_cpu_s") + extra
    guard["fraction_of_step"] = guard["total_ms"] / 1000 / off_step
    guard["cpu_fraction_of_step"] = guard["total_cpu_ms"] / 1000 / off_step
    return {**common, "guard_time": guard, "guard_ratio": 1 + guard["fraction_of_step"], "timings": timings}
