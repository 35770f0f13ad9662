"""Throughput for 1 and 2 workers through raytrain, and how the per-step overhead grows with the number of
``ctx.report`` calls, the Ray Train health-check interval and the checkpoint size.

    .venv/bin/python bench/scaling.py                  # full (about 10-15 min on 2 cores)
    .venv/bin/python bench/scaling.py --smoke          # few steps, no torchrun or health-check runs

All runs use bench/jobs/report_freq.py (the GPT of jobs/gpt_zero.py with ``--report-every`` and
``--ballast-mparams``), bf16, grad-accum 4, ZeRO 1, CPU workers on the local cluster (started if needed,
stopped at the end only if this script started it).

1. workers: the same job on 1 and 2 workers (same micro-batch per worker): steady samples/s and the
   scaling efficiency ``samples/s(2) / (2 x samples/s(1))``.
2. report frequency: 2 workers, ``--report-every 1`` against ``--report-every N``; the time per step over the
   same steps (N, S] from ``elapsed_s``, and the cost of one report ``(t1 - tN) / (1 - 1/N)``. Without
   --smoke the same pair also runs under torchrun (bench/bare_runner.py: a report is one stdout line), and
   ``--report-every 1`` runs again with Ray's own controller (``RAYTRAIN_RAY_TUNING=off``) polling every
   ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` of --health-intervals (raytrain's polls every 2 s and when a worker asks).
3. checkpoints: 2 workers, ``--checkpoint-every C`` on a small model and on the same model with
   --ballast-mparams million extra parameters (big checkpoint, same compute). A checkpoint is saved inside
   the report of step kC: its cost is the duration of that ``ctx.report`` call (the job measures each call
   and sends it with the next report), and shows again in the next step's ``step_time_s`` (mean of those
   minus the median of the other steady steps). Size from ``raytrain jobs checkpoints``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

JOB = str(bl.BENCH / "jobs" / "report_freq.py")
MODEL_ARGS = "--vocab 512 --dim 128 --layers 4 --heads 4 --seq 64"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 40; --smoke 8); a multiple of --report-every")
    p.add_argument("--report-every", type=int, default=None, help="N for the report-frequency pair (default 10; --smoke 4)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="C (default 5; --smoke 3)")
    p.add_argument("--ballast-mparams", type=float, default=None, help="extra parameters of the big-checkpoint model, millions (default 16; --smoke 2)")
    p.add_argument("--model-args", default=MODEL_ARGS, help="the model's job arguments (default: %(default)r)")
    p.add_argument("--health-intervals", type=float, nargs="*", default=None,
                   help="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S values of Ray's own controller to compare with raytrain's prompt polls "
                        "(default 0.2 0.05; --smoke none)")
    p.add_argument("--bare", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the report pair under torchrun (default: on; --smoke off)")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--zero", type=int, default=1)
    p.add_argument("--warmup", type=int, default=None, help="steps left out of the steady state (default 3; --smoke 2)")
    p.add_argument("--num-cpus", type=float, default=None)
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--out", default="bench/results/scaling.json")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    smoke = a.smoke
    a.steps = a.steps or (8 if smoke else 40)
    a.report_every = a.report_every or (4 if smoke else 10)
    a.checkpoint_every = a.checkpoint_every or (3 if smoke else 5)
    a.ballast_mparams = a.ballast_mparams if a.ballast_mparams is not None else (2.0 if smoke else 16.0)
    a.health_intervals = a.health_intervals if a.health_intervals is not None else ([] if smoke else [0.2, 0.05])
    a.bare = a.bare if a.bare is not None else not smoke
    a.warmup = a.warmup if a.warmup is not None else (2 if smoke else 3)
    if a.steps % a.report_every or a.steps < 2 * a.report_every:
        p.error(f"--steps {a.steps} must be a multiple of --report-every {a.report_every}, at least twice it")
    return a


def mean_step_between(run: bl.Run, metrics: list[dict], lo: int, hi: int) -> float | None:
    """Mean time per step over steps (lo, hi], from the elapsed_s of the reports at lo and hi."""
    at = {m.get("step"): m.get("elapsed_s") for m in metrics}
    if lo in at and hi in at and isinstance(at[lo], (int, float)) and isinstance(at[hi], (int, float)):
        return (at[hi] - at[lo]) / (hi - lo)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    model = args.model_args.split()
    base = ["--steps", str(args.steps)] + model

    def flags(workers: int, extra: list[str] | None = None) -> list[str]:
        return bl.submit_flags(workers=workers, zero=args.zero, precision=args.precision,
                               grad_accum=args.grad_accum, micro_batch=1, extra=extra)

    metrics_of: dict[str, list[dict]] = {}

    def submit(label: str, workers: int, job_args: list[str], extra: list[str] | None = None) -> bl.Run:
        run = bl.run_raytrain(JOB, flags(workers, extra), job_args, env, label=label, rnd=0, warmup=args.warmup)
        metrics_of[label] = getattr(run, "metrics", [])
        bl.log(f"scaling: {label:28s} " + (f"steps {run.steps}, steady {bl.fmt(run.steady_step_s, ' s', 3)}, "
                                            f"{bl.fmt(run.steady_samples_per_s, ' samples/s', 2)}, wall {bl.fmt(run.wall_s, ' s', 1)}"
                                            if run.ok else f"FAILED: {run.error}"))
        return run

    def bare(label: str, job_args: list[str]) -> bl.Run:
        plan = bl.dry_run_plan(JOB, flags(2), job_args, env)["plan"]
        run = bl.run_bare(plan, env, label=label, rnd=0, warmup=args.warmup)
        metrics_of[label] = getattr(run, "metrics", [])
        bl.log(f"scaling: {label:28s} " + (f"steps {run.steps}, steady {bl.fmt(run.steady_step_s, ' s', 3)}"
                                            if run.ok else f"FAILED: {run.error}"))
        return run

    started = bl.cluster_up(env, args.num_cpus)
    bl.log("scaling: local cluster " + ("started" if started else "already running (warm)"))
    runs: dict[str, bl.Run] = {}
    t_start = time.time()
    n, s, c = args.report_every, args.steps, args.checkpoint_every
    try:
        if started:  # the first job on a fresh cluster pays one-off costs: a short uncounted job first
            bl.run_raytrain(JOB, flags(2), ["--steps", "2"] + model, env, label="warm-up", rnd=-1, warmup=0)
        runs["1 worker"] = submit("1 worker", 1, base)
        runs["2 workers"] = submit("2 workers", 2, base)
        runs[f"report every {n}"] = submit(f"report every {n}", 2, base + ["--report-every", str(n)])
        for interval in args.health_intervals:
            runs[f"health check {interval:g} s"] = submit(
                f"health check {interval:g} s", 2, base, ["--env", "RAYTRAIN_RAY_TUNING=off", "--env", f"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={interval:g}"])
        ckpt = ["--checkpoint-every", str(c), "--keep", "1"]
        runs["checkpoint small"] = submit("checkpoint small", 2, base, ckpt)
        runs["checkpoint big"] = submit("checkpoint big", 2, base + ["--ballast-mparams", f"{args.ballast_mparams:g}"], ckpt)
        if args.bare:
            runs["torchrun report every 1"] = bare("torchrun report every 1", base)
            runs[f"torchrun report every {n}"] = bare(f"torchrun report every {n}", base + ["--report-every", str(n)])
        sizes = {}
        for label in ("checkpoint small", "checkpoint big"):
            run = runs[label]
            if run.job_id:
                proc = bl.run_cli("jobs", "checkpoints", run.job_id, "--json", env=env, timeout=120, check=False)
                try:
                    found = json.loads(proc.stdout)
                    sizes[label] = max((x.get("size_bytes") or 0) for x in found) if found else None
                except ValueError:
                    sizes[label] = None
    finally:
        if started and not args.keep_cluster:
            bl.cluster_down(env)
            bl.log("scaling: local cluster stopped")

    # -- figures ---------------------------------------------------------------------------------------
    w1, w2 = runs["1 worker"], runs["2 workers"]
    workers = {
        "1": {"steady_step_s": w1.steady_step_s, "samples_per_s": w1.steady_samples_per_s},
        "2": {"steady_step_s": w2.steady_step_s, "samples_per_s": w2.steady_samples_per_s},
        "efficiency": bl.ratio(w2.steady_samples_per_s, 2 * w1.steady_samples_per_s if w1.steady_samples_per_s else None),
    }

    def call_s(label: str) -> float | None:
        """Median duration of the ctx.report call itself (the job's last_report_s), steady reports only."""
        return bl.median([x.get("last_report_s") for x in metrics_of.get(label, [])[1:] if x.get("step", 0) > args.warmup + 1])

    def report_pair(every1: str, everyn: str) -> dict:
        t1 = mean_step_between(runs[every1], metrics_of.get(every1, []), n, s)
        tn = mean_step_between(runs[everyn], metrics_of.get(everyn, []), n, s)
        per_report = (t1 - tn) / (1 - 1 / n) if t1 is not None and tn is not None else None
        return {"every_1_step_s": t1, f"every_{n}_step_s": tn, "per_report_s": per_report,
                "overhead_every_1": bl.ratio(t1, tn), "report_call_s": call_s(every1)}

    report = {"raytrain": report_pair("2 workers", f"report every {n}"), "window_steps": [n, s]}
    if args.bare:
        report["torchrun"] = report_pair("torchrun report every 1", f"torchrun report every {n}")
    health = {"2 + when asked (raytrain's)": {"step_s": mean_step_between(w2, metrics_of.get("2 workers", []), n, s),
                                   "report_call_s": call_s("2 workers")}}
    for interval in args.health_intervals:
        label = f"health check {interval:g} s"
        health[f"{interval:g}"] = {"step_s": mean_step_between(runs[label], metrics_of.get(label, []), n, s),
                                   "report_call_s": call_s(label)}
    checkpoints = {}
    for label in ("checkpoint small", "checkpoint big"):
        m = [x for x in metrics_of.get(label, []) if x.get("step", 0) > args.warmup]
        after = [x for x in m if (x["step"] - 1) % c == 0 and x["step"] > 1]  # the report after a checkpoint's
        other = [x for x in m if (x["step"] - 1) % c != 0]
        base_t = bl.median([x.get("step_time_s") for x in other])
        after_t = [x["step_time_s"] for x in after if isinstance(x.get("step_time_s"), (int, float))]
        # direct: the checkpointing ctx.report call's duration (carried by the next report)
        ckpt_calls = [x["last_report_s"] for x in after if isinstance(x.get("last_report_s"), (int, float))]
        checkpoints[label] = {
            "size_bytes": sizes.get(label), "checkpoints": len(runs[label].checkpoints), "step_s": base_t,
            "checkpoint_report_call_s": sum(ckpt_calls) / len(ckpt_calls) if ckpt_calls else None,
            "plain_report_call_s": bl.median([x.get("last_report_s") for x in other]),
            "per_checkpoint_s_from_step_times": (sum(after_t) / len(after_t) - base_t) if after_t and base_t else None,
        }

    results = {
        "benchmark": "scaling", "machine": bl.machine(),
        "settings": {**{k: v for k, v in vars(args).items()}, "cluster_started_here": started,
                     "duration_s": round(time.time() - t_start, 1)},
        "workers": workers, "report_frequency": report, "health_check_step_s": health, "checkpoints": checkpoints,
        "runs": {k: r.to_dict() for k, r in runs.items()},
    }
    path = bl.write_json(args.out, results)

    print(f"## raytrain scaling: {args.precision}, ZeRO {args.zero}, grad-accum {args.grad_accum}, "
          f"`report_freq.py --steps {s} {args.model_args}`\n")
    print(bl.markdown_table(
        ["workers", "steady step", "samples/s", "efficiency"],
        [["1", bl.fmt(w1.steady_step_s, " ms", 0, 1000), bl.fmt(w1.steady_samples_per_s, "", 2), ""],
         ["2", bl.fmt(w2.steady_step_s, " ms", 0, 1000), bl.fmt(w2.steady_samples_per_s, "", 2),
          bl.fmt(workers["efficiency"], "", 2)]]))
    print(f"\nReport frequency (2 workers; mean time per step over steps {n}..{s}; one ctx.report call, median):\n")
    rows = []
    for side in [k for k in ("raytrain", "torchrun") if k in report]:
        r = report[side]
        rows.append([side, bl.fmt(r["every_1_step_s"], " ms", 1, 1000), bl.fmt(r[f"every_{n}_step_s"], " ms", 1, 1000),
                     bl.fmt(r["per_report_s"], " ms", 1, 1000), bl.fmt(r["overhead_every_1"], "", 3),
                     bl.fmt(r["report_call_s"], " ms", 1, 1000)])
    print(bl.markdown_table(["runner", "report every step", f"every {n} steps", "cost per report (from steps)", "ratio",
                             "ctx.report call"], rows))
    if len(health) > 1:
        print("\nThe controller's poll interval (2 workers, report every step; other rows: Ray's controller):\n")
        print(bl.markdown_table(["interval (s)", "time per step", "ctx.report call"],
                                [[k, bl.fmt(v["step_s"], " ms", 1, 1000), bl.fmt(v["report_call_s"], " ms", 1, 1000)]
                                 for k, v in health.items()]))
    print(f"\nCheckpoints every {c} steps (2 workers, ZeRO {args.zero}; the ctx.report call that saves one, mean):\n")
    print(bl.markdown_table(
        ["model", "checkpoint size", "checkpoints", "step", "report with checkpoint", "report without", "from step times"],
        [[label.split()[-1] + (f" (+{args.ballast_mparams:g}M ballast)" if "big" in label else ""),
          bl.fmt(v["size_bytes"] / 2**20 if v["size_bytes"] else None, " MiB", 1), str(v["checkpoints"]),
          bl.fmt(v["step_s"], " ms", 0, 1000), bl.fmt(v["checkpoint_report_call_s"], " s", 2),
          bl.fmt(v["plain_report_call_s"], " ms", 1, 1000), bl.fmt(v["per_checkpoint_s_from_step_times"], " s", 2)]
         for label, v in checkpoints.items()]))
    print(f"\nJSON: {path}")
    return 0 if all(r.ok for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
