"""Time from the command to step 1, phase by phase, with a start-up cut on (A) and off (B), alternated.

    .venv/bin/python bench/start_time.py                      # A: raytrain as is; B: stock Ray (RAYTRAIN_RAY_TUNING=off)
    .venv/bin/python bench/start_time.py --rounds 6 --b-env RAYTRAIN_RAY_TUNING=off
    .venv/bin/python bench/start_time.py --b-env RAYTRAIN_LOCAL_UPLOAD=1 --out bench/results/start_no_upload.json

Each round submits the same small job (``jobs/gpt_zero.py``, 2 CPU workers, ZeRO-1, 3 steps) once per side
(A B A B ...; ``--b-env KEY=VALUE`` is passed to B's ``submit --env``) on the calling environment's local
cluster (started if down, then stopped) and reads ``jobs status ID --timings --json``. Per phase it reports the
median seconds the phase added ("took") and the median CPU seconds of the process that marked it ("cpu":
the driver for driver_ready, Ray Train's controller for workers_started..process_group, the slowest worker
for the worker phases). On a shared, busy machine wall times swing by tens of seconds between runs; the CPU
column is what to compare there. Writes --out (JSON: every run, the medians, and ``cut_buys``: B minus A per
phase, i.e. what the cut buys) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

JOB_ARGS = ["--steps", "3", "--vocab", "512", "--dim", "128", "--layers", "4", "--heads", "4", "--seq", "64"]
FLAGS = ["--workers", "2", "--zero", "1", "--precision", "bf16", "--grad-accum", "4"]


def one_job(env: dict[str, str], extra_env: list[str]) -> list[dict]:
    """Submit the job, wait for it, and return its timings rows (dicts)."""
    args = ["submit", "jobs/gpt_zero.py", *FLAGS, "--json", "-q"]
    for kv in extra_env:
        args += ["--env", kv]
    out = bl.run_cli(*args, "--", *JOB_ARGS, env=env, timeout=900).stdout
    job_id = json.loads(out)["id"]
    status = json.loads(bl.run_cli("jobs", "status", job_id, "--timings", "--json", env=env).stdout)
    if status.get("state") != "succeeded":
        raise RuntimeError(f"{job_id} ended {status.get('state')}: {status.get('message')}")
    return status["timings"]


def summarise(runs: list[dict]) -> dict:
    """side -> phase -> {took_s, cpu_s, at_s}: medians over the side's runs."""
    out: dict[str, dict] = {}
    for side in sorted({r["side"] for r in runs}):
        phases: dict[str, dict[str, list[float]]] = {}
        for run in (r for r in runs if r["side"] == side):
            for row in run["timings"]:
                p = phases.setdefault(row["phase"], {"took_s": [], "cpu_s": [], "at_s": []})
                for key in p:
                    if row.get(key) is not None:
                        p[key].append(row[key])
        out[side] = {phase: {k: round(statistics.median(v), 2) if v else None for k, v in vals.items()}
                     for phase, vals in phases.items()}
    return out


def cut_buys(summary: dict, b_env: list[str]) -> dict:
    """What the cut B turns off buys: B minus A per phase (medians; positive = A is faster), and at step 1."""
    a, b = summary.get("A", {}), summary.get("B", {})

    def diff(phase: str, key: str):
        va, vb = a.get(phase, {}).get(key), b.get(phase, {}).get(key)
        return round(vb - va, 2) if va is not None and vb is not None else None

    return {
        "cut_off_in_B": b_env,
        "first_step_at_s": diff("first_step", "at_s"),
        "took_s": {phase: diff(phase, "took_s") for phase in a if phase in b},
        "cpu_s": {phase: diff(phase, "cpu_s") for phase in a if phase in b and diff(phase, "cpu_s") is not None},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--b-env", action="append", default=None, metavar="KEY=VALUE",
                   help="side B's submit --env (default: RAYTRAIN_RAY_TUNING=off: stock Ray)")
    p.add_argument("--out", default="bench/results/start_time.json")
    args = p.parse_args(argv)
    b_env = args.b_env or ["RAYTRAIN_RAY_TUNING=off"]
    env = dict(os.environ)
    started = bl.cluster_up(env)
    runs = []
    try:
        for rnd in range(args.rounds):
            for side, extra in (("A", []), ("B", b_env)):
                t0 = time.monotonic()
                try:
                    rows = one_job(env, extra)
                except Exception as exc:  # a busy machine: note it, keep the other rounds
                    bl.log(f"round {rnd + 1} {side}: failed: {str(exc)[-300:]}")
                    continue
                runs.append({"round": rnd + 1, "side": side, "env": extra, "timings": rows,
                             "wall_s": round(time.monotonic() - t0, 1)})
                first = next((r["at_s"] for r in rows if r["phase"] == "first_step"), None)
                bl.log(f"round {rnd + 1} {side}: command -> step 1 {first} s")
    finally:
        if started:
            bl.cluster_down(env)
    summary = summarise(runs)
    data = {"machine": bl.machine(), "settings": {**vars(args), "b_env": b_env}, "runs": runs, "summary": summary,
            "cut_buys": cut_buys(summary, b_env)}
    out = bl.write_json(args.out, data)
    a, b = summary.get("A", {}), summary.get("B", {})
    rows = []
    for phase in [ph for ph in a if ph in b] or list(a):
        ra, rb = a.get(phase, {}), b.get(phase, {})
        rows.append([phase, bl.fmt(ra.get("took_s"), " s"), bl.fmt(rb.get("took_s"), " s"),
                     bl.fmt(ra.get("cpu_s"), " s"), bl.fmt(rb.get("cpu_s"), " s")])
    print(f"A: as is; B: {' '.join(b_env)}; medians of {args.rounds} rounds")
    print(bl.markdown_table(["phase", "took A", "took B", "cpu A", "cpu B"], rows))
    print(f"command -> step 1 (median): A {bl.fmt(a.get('first_step', {}).get('at_s'), ' s')}, "
          f"B {bl.fmt(b.get('first_step', {}).get('at_s'), ' s')}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
