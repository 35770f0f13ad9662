"""What bench/overhead.py and bench/scaling.py share: running one job through `raytrain submit` (A) or
through torchrun + bench/bare_runner.py (B), reading both logs with the same ``JobFacts``, and the figures.

Every run is a subprocess started from here; its clock starts right before the subprocess does, so "time
to first step" is ``wall_time`` of the step-1 metrics event (``time.time()`` on the worker, same machine)
minus that start.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raytrain.events import JobFacts  # noqa: E402


def raytrain_cmd(*args: Any) -> list[str]:
    return [sys.executable, "-m", "raytrain.cli.main", *map(str, args)]


def run_cli(*args: Any, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(raytrain_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"raytrain {' '.join(map(str, args))} exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


# -- the cluster -------------------------------------------------------------------------------------
def cluster_up(env: dict[str, str], num_cpus: float | None = None) -> bool:
    """Start the local cluster if it is not running; True if this call started it."""
    args = ["cluster", "up"] + (["--num-cpus", num_cpus] if num_cpus is not None else [])
    out = run_cli(*args, env=env, timeout=300).stdout
    return "cluster started" in out


def cluster_down(env: dict[str, str]) -> None:
    run_cli("cluster", "down", "--force", env=env, timeout=180, check=False)


# -- CPU accounting ----------------------------------------------------------------------------------
WORKER_MARKS = ("ray::RayTrainWorker", "bare_runner.py")  # the training processes of A and of B


def processes():
    """(pid, the /proc/PID/stat fields after the command name, the command line) of every process (Linux)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read(300).decode(errors="replace").replace("\0", " ").strip()
        except OSError:
            continue
        yield int(name), stat[stat.rindex(")") + 2:].split(), cmd


class CpuSampler:
    """Samples every process's CPU time (/proc) once per ``interval`` in a thread, so that a run's window
    (e.g. its steady steps) can be split into CPU used by the training processes and by everything else
    (Ray's own processes, the CLI, and whatever else runs on the machine). Linux only; a no-op elsewhere."""

    def __init__(self, interval: float = 0.5):
        import threading

        self.interval = interval
        self.samples: list[tuple[float, dict[int, tuple[int, bool]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _snapshot(self) -> dict[int, tuple[int, bool]]:
        return {pid: (int(fields[11]) + int(fields[12]), any(m in cmd for m in WORKER_MARKS))
                for pid, fields, cmd in processes()}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._snapshot()))
            self._stop.wait(self.interval)

    def __enter__(self) -> "CpuSampler":
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def usage(self, t_from: float | None, t_to: float | None) -> dict[str, float] | None:
        """Average cores used between the first sample from ``t_from`` and the last one up to ``t_to`` (both
        inside the window: a sample after it may miss the training processes, which exit right after their
        last step): workers, other, total; None when the window holds less than two sampling intervals."""
        if t_from is None or t_to is None or len(self.samples) < 2:
            return None
        inside = [s for s in self.samples if t_from <= s[0] <= t_to]
        if len(inside) < 3:
            return None
        a, b = inside[0], inside[-1]
        dt = b[0] - a[0]
        workers = other = 0
        for pid, (ticks, is_worker) in b[1].items():
            start = a[1].get(pid, (0, is_worker))[0]  # a process born inside the window counts from 0
            delta = max(ticks - start, 0)
            if is_worker or a[1].get(pid, (0, False))[1]:
                workers += delta
            else:
                other += delta
        w, o = workers / self._hz / dt, other / self._hz / dt
        return {"workers": round(w, 3), "other": round(o, 3), "total": round(w + o, 3), "window_s": round(dt, 1)}


# -- one run -----------------------------------------------------------------------------------------
@dataclass
class Run:
    side: str  # "raytrain" | "torchrun"
    label: str
    round: int
    ok: bool = False
    error: str | None = None
    job_id: str | None = None
    load_before: float | None = None  # 1-minute load average when the run started
    wall_s: float | None = None  # command start to command exit
    first_step_s: float | None = None  # command start to the end of step 1
    steps: int = 0
    step_times: list[float] = field(default_factory=list)
    steady_step_s: float | None = None  # median step_time_s after the warm-up steps
    steady_samples_per_s: float | None = None
    train_elapsed_s: float | None = None  # elapsed_s of the last step (ctx built -> last report)
    # Where the time outside the steps goes, from command start (seconds): the job accepted by the cluster
    # (A only), the train context built on rank 0, the last step done; teardown = wall_s - last_step_s.
    job_start_s: float | None = None
    job_end_s: float | None = None  # A: Ray's end time of the job (the driver exited)
    ctx_ready_s: float | None = None
    last_step_s: float | None = None
    teardown_s: float | None = None
    rss_peak_gb: dict[str, float] = field(default_factory=dict)  # rank -> peak RSS
    allocator: str | None = None  # the workers' malloc: A as its preflight reports it, B from LD_PRELOAD
    # cores used during the steady steps (after the warm-up, to the last step): training processes / the rest
    steady_cpu: dict[str, float] | None = None
    losses: list[float] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fill_from_facts(run: Run, facts: JobFacts, t0: float, warmup: int, cpu: CpuSampler | None = None) -> None:
    metrics = sorted(facts.metrics, key=lambda m: m.get("step", 0))
    run.metrics = metrics  # not a dataclass field: kept out of the JSON
    run.steps = len(metrics)
    run.step_times = [m["step_time_s"] for m in metrics if isinstance(m.get("step_time_s"), (int, float))]
    # The first report's interval starts when the context is built (engine build included): never steady.
    steady = [m for m in metrics[1:] if m.get("step", 0) > warmup]
    run.steady_step_s = median([m.get("step_time_s") for m in steady])
    run.steady_samples_per_s = median([m.get("samples_per_s") for m in steady])
    run.losses = [m["loss"] for m in metrics if isinstance(m.get("loss"), (int, float))]
    if metrics and isinstance(metrics[0].get("wall_time"), (int, float)):
        run.first_step_s = round(metrics[0]["wall_time"] - t0, 3)
    if metrics and isinstance(metrics[-1].get("elapsed_s"), (int, float)):
        run.train_elapsed_s = metrics[-1]["elapsed_s"]
    first, last = (metrics[0], metrics[-1]) if metrics else ({}, {})
    if isinstance(first.get("wall_time"), (int, float)) and isinstance(first.get("elapsed_s"), (int, float)):
        run.ctx_ready_s = round(first["wall_time"] - first["elapsed_s"] - t0, 3)
    if isinstance(last.get("wall_time"), (int, float)):
        run.last_step_s = round(last["wall_time"] - t0, 3)
        if run.wall_s is not None:
            run.teardown_s = round(run.wall_s - run.last_step_s, 3)
    run.rss_peak_gb = {str(rank): round(m["rss_peak"] / 1e9, 3)
                       for rank, m in sorted(facts.memory.items()) if m.get("rss_peak")}
    run.checkpoints = [c for c in facts.checkpoints if c is not None]
    allocators = {w.get("allocator") for w in (facts.preflight or {}).get("workers") or []} - {None}
    if allocators:
        run.allocator = ",".join(sorted(allocators))
    if cpu is not None and len(steady) >= 2:
        run.steady_cpu = cpu.usage(steady[0].get("wall_time"), steady[-1].get("wall_time"))


def submit_flags(*, workers: int, zero: int, precision: str, grad_accum: int, micro_batch: int,
                 extra: list[str] | None = None) -> list[str]:
    return ["--workers", str(workers), "--gpus-per-worker", "0", "--zero", str(zero), "--precision", precision,
            "--grad-accum", str(grad_accum), "--micro-batch", str(micro_batch), *(extra or [])]


def dry_run_plan(job: str, flags: list[str], job_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The request `raytrain submit` would send for these flags: its plan holds the exact DeepSpeed dict."""
    out = run_cli("submit", job, *flags, "--dry-run", "--json", "--", *job_args, env=env, timeout=120).stdout
    return json.loads(out)


def run_raytrain(job: str, flags: list[str], job_args: list[str], env: dict[str, str], *, label: str,
                 rnd: int, warmup: int, timeout: float = 900) -> Run:
    """A: `raytrain submit JOB FLAGS --json -q -- JOB_ARGS` on the running local cluster; events from its log."""
    run = Run("raytrain", label, rnd, load_before=os.getloadavg()[0])
    cmd = raytrain_cmd("submit", job, *flags, "--json", "-q", "--", *job_args)
    t0 = time.time()
    try:
        with CpuSampler() as cpu:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, cwd=ROOT)
    except subprocess.TimeoutExpired:
        run.wall_s, run.error = round(time.time() - t0, 3), f"timed out after {timeout:.0f} s"
        return run
    run.wall_s = round(time.time() - t0, 3)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    run.job_id = info.get("id")
    if isinstance(info.get("start_time"), (int, float)):
        run.job_start_s = round(info["start_time"] - t0, 3)
    if isinstance(info.get("end_time"), (int, float)):
        run.job_end_s = round(info["end_time"] - t0, 3)
    if proc.returncode != 0 or not run.job_id:
        run.error = f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-1500:]}"
        if not run.job_id:
            return run
    logs = run_cli("jobs", "logs", run.job_id, "-v", env=env, timeout=120, check=False).stdout
    fill_from_facts(run, JobFacts.from_lines(logs.splitlines()), t0, warmup, cpu)
    run.ok = proc.returncode == 0 and run.steps > 0
    return run


def bare_env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several processes, and Ray's for 1-CPU workers
    env["PYTHONUNBUFFERED"] = "1"
    for key in ("RAY_ADDRESS", "RAYTRAIN_ADDRESS"):
        env.pop(key, None)
    return env


def jemalloc_preload() -> dict[str, str]:
    """LD_PRELOAD of the jemalloc Ray ships (what raytrain's CPU workers run with on its own nodes)."""
    from raytrain.ray_tuning.ray_setup_worker import jemalloc_library

    library = jemalloc_library()
    if library is None:
        raise SystemExit("bench: this Ray has no core/libjemalloc.so to preload")
    return {"LD_PRELOAD": library}


def ray_driver_env(env: dict[str, str]) -> dict[str, str]:
    """For B's processes: connect each to the running local cluster (of ``env``) as a Ray driver before training
    (bench/bare_runner.py reads ``RAYTRAIN_BARE_RAY``), so that B carries what a Ray core worker costs inside a
    training process (its C++ threads, the object store mapped) and A/B is then raytrain's cost beyond Ray's."""
    from raytrain.clusters import local_head

    status = json.loads(run_cli("cluster", "status", "--json", env=env, timeout=120).stdout)
    if not status.get("running"):
        raise SystemExit("bench: --bare-ray needs the local cluster running")
    out = {"RAYTRAIN_BARE_RAY": status["gcs_address"], "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": status["token_path"], "RAY_USAGE_STATS_ENABLED": "0"}
    if status["gcs_address"].startswith(local_head.LOOPBACK + ":"):
        out.update(local_head.SINGLE_MACHINE_ENV)  # as the cluster's own processes: stay on 127.0.0.1
    return out


def run_bare(plan: dict[str, Any], env: dict[str, str], *, label: str, rnd: int, warmup: int,
             timeout: float = 900, nice: int = 0, extra_env: dict[str, str] | None = None) -> Run:
    """B: torchrun with the plan's number of processes, each running bench/bare_runner.py on the same plan.
    ``nice``: run it at this niceness (Ray starts its workers at 15; the job driver at 0). ``extra_env``: set
    for B only (e.g. jemalloc_preload())."""
    run = Run("torchrun", label, rnd, load_before=os.getloadavg()[0])
    run.extra["nice"] = nice
    b_env = {**bare_env(env), **(extra_env or {})}
    run.allocator = "jemalloc" if "libjemalloc" in b_env.get("LD_PRELOAD", "") else "default"
    ray_driver = bool(b_env.get("RAYTRAIN_BARE_RAY"))  # overhead.py --bare-ray
    if ray_driver:
        run.allocator += " + Ray driver"  # overhead.py --bare-ray: shown beside the allocator in the table
    nproc = int(plan["scaling"]["num_workers"])
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench-plan-", delete=False) as f:
        json.dump(plan, f)
        plan_path = f.name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(BENCH / "bare_runner.py"), plan_path]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    t0 = time.time()
    try:
        with CpuSampler() as cpu:
            proc = subprocess.run(cmd, env=b_env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, cwd=ROOT)
    except subprocess.TimeoutExpired:
        run.wall_s, run.error = round(time.time() - t0, 3), f"timed out after {timeout:.0f} s"
        return run
    finally:
        os.unlink(plan_path)
    run.wall_s = round(time.time() - t0, 3)
    fill_from_facts(run, JobFacts.from_lines(proc.stdout.splitlines()), t0, warmup, cpu)
    if ray_driver:
        run.extra["ray_drivers"] = proc.stdout.count(" is a Ray driver of ")  # processes that did connect
    for line in proc.stdout.splitlines():  # BARE_RUNNER_GUARD_TIMING: each rank's seconds inside the guards
        if line.startswith("bare_runner: rank ") and " guard_s " in line:
            words = line.split()
            fields = dict(zip(words[3::2], words[4::2]))
            run.extra.setdefault("guard_timing", {})[words[2]] = {k: float(v) for k, v in fields.items()}
    if proc.returncode != 0:
        run.error = f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"
    run.ok = proc.returncode == 0 and run.steps > 0
    return run


# -- reporting ---------------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def spread(values: list[float | None]) -> list[float] | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return [min(values), max(values)] if values else None


def fmt(value: Any, unit: str = "", digits: int = 2, scale: float = 1.0) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value * scale:.{digits}f}{unit}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    versions = {}
    for name in ("torch", "deepspeed", "ray"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = None
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    p = Path(path)
    if not p.is_absolute():
        p = ROOT / p
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2, sort_keys=False, default=str))
    return p


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)
