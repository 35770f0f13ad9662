"""What one job costs the machine, from the command to its exit: CPU seconds of every process it runs (the
CLI, Ray's job supervisor, the driver, Ray Train's controller and helper actors, the workers) and wall time,
with raytrain's job settings (A) against Ray's and DeepSpeed's own defaults (B), alternated in one run.

    .venv/bin/python bench/job_cost.py                     # 3 rounds of A B, jobs/gpt_zero.py, 2 workers
    .venv/bin/python bench/job_cost.py --rounds 1 --zero 3

B adds ``--env`` overrides that undo raytrain's per-job cuts: Ray Train's preemption watcher and metrics
(off on the local cluster: targets/base.py LOCAL_RUNTIME_ENV_VARS), DeepSpeed importing mlflow
(runtime/worker/deepspeed_imports.py) and the processes the driver starts ahead (runtime/prestart.py). On a machine where CPU
is the limit (2 cores: CI), CPU seconds per job is what sets how long every test and edit-run loop takes; it
is also the figure least disturbed by other load.

CPU is the machine's busy time (/proc/stat: user, nice, system, irq, softirq, steal) from the command's start
to 3 s after its exit: run it on an otherwise idle machine. (Summing the cluster's process tree misses most
of it: the raylet does not account the worker processes it reaps.) Uses the local cluster of the calling
environment (RAYTRAIN_HOME, RAYTRAIN_PORT, ...), started if needed. Writes --out (JSON), prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

RAY_DEFAULTS = ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=1", "RAY_TRAIN_METRICS_ENABLED=1", "RAYTRAIN_RAY_TUNING=off"]


def tree_cpu_s(root: int) -> tuple[float, int]:
    """CPU seconds of ``root`` and its descendants (each with the children it reaped), and how many."""
    hz = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for pid, fields, _cmd in bl.processes():
        kids.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = sum(int(fields[i]) for i in (11, 12, 13, 14))
    total, count, stack = 0, 0, [root]
    while stack:
        pid = stack.pop()
        if pid in ticks:
            total += ticks[pid]
            count += 1
        stack += kids.get(pid, [])
    return total / hz, count


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


idle_cluster_cores = 0.0  # set by main(): what the idle cluster uses, taken off the 3 s after each job


def one_job(side: str, job: str, flags: list[str], job_args: list[str], env: dict[str, str], root: int) -> dict:
    extra = [f for kv in RAY_DEFAULTS for f in ("--env", kv)] if side == "ray-defaults" else []
    cmd = bl.raytrain_cmd("submit", job, *flags, *extra, "--json", "-q", "--", *job_args)
    load = os.getloadavg()[0]
    cpu0, t0 = machine_busy_s(), time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                          cwd=bl.ROOT)
    wall = time.time() - t0
    time.sleep(3)  # let the raylet reap the job's last processes, so their CPU is counted
    cpu1, live = machine_busy_s(), tree_cpu_s(root)[1]
    run = {"side": side, "ok": proc.returncode == 0, "wall_s": round(wall, 2),
           "cpu_s": round(cpu1 - cpu0 - 3 * idle_cluster_cores, 2), "cluster_processes_after": live,
           "load_before": round(load, 2)}
    try:
        job_id = json.loads(proc.stdout)["id"]
        status = bl.run_cli("jobs", "status", job_id, "--timings", "--json", env=env, timeout=120).stdout
        run["timings"] = {t["phase"]: t["at_s"] for t in json.loads(status).get("timings") or []}
    except (ValueError, KeyError, subprocess.SubprocessError) as exc:
        run["error"] = f"{exc}: {(proc.stderr or proc.stdout)[-800:]}"
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", default="jobs/gpt_zero.py")
    p.add_argument("--job-args", default="--steps 6")
    p.add_argument("--zero", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="bench/results/job_cost.json")
    args = p.parse_args(argv)
    env = dict(os.environ)
    started = bl.cluster_up(env)
    home = Path(env.get("RAYTRAIN_HOME", Path.home() / ".raytrain"))
    root = json.loads((home / "cluster.json").read_text())["pid"]
    flags = ["--workers", "2", "--zero", str(args.zero)]
    global idle_cluster_cores
    try:
        one_job("raytrain", args.job, flags, args.job_args.split(), env, root)  # warm-up: op caches, page cache
        before = machine_busy_s()
        time.sleep(10)
        idle_cluster_cores = (machine_busy_s() - before) / 10
        runs = []
        for rnd in range(args.rounds):
            for side in ("raytrain", "ray-defaults"):
                run = {"round": rnd + 1, **one_job(side, args.job, flags, args.job_args.split(), env, root)}
                runs.append(run)
                bl.log(f"round {rnd + 1} {side}: {run['cpu_s']} CPU s, {run['wall_s']} s wall, ok={run['ok']}")
    finally:
        if started:
            bl.cluster_down(env)
    med = {s: {k: bl.median([r[k] for r in runs if r["side"] == s and r["ok"]]) for k in ("cpu_s", "wall_s")}
           for s in ("raytrain", "ray-defaults")}
    data = {"machine": bl.machine(), "settings": vars(args), "runs": runs, "summary": med,
            "ratio": {k: bl.ratio(med["raytrain"][k], med["ray-defaults"][k]) for k in ("cpu_s", "wall_s")}}
    out = bl.write_json(args.out, data)
    print(bl.markdown_table(["side", "CPU s per job (median)", "wall s (median)"],
                            [[s, bl.fmt(med[s]["cpu_s"]), bl.fmt(med[s]["wall_s"])] for s in med]
                            + [["A/B", bl.fmt(data["ratio"]["cpu_s"]), bl.fmt(data["ratio"]["wall_s"])]]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
