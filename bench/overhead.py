"""raytrain against bare DeepSpeed under torchrun: the same job, seed and DeepSpeed config on 2 CPU workers.

    .venv/bin/python bench/overhead.py                 # ZeRO 1 and 3, bf16, grad-accum 4, 3 rounds
    .venv/bin/python bench/overhead.py --smoke         # 1 round, few steps, ZeRO 1 only (what CI runs)

For each config and round it runs, one after the other (A B A B ...):

  A  ``raytrain submit JOB --workers 2 --zero Z --precision bf16 --grad-accum 4 --json -q -- JOB_ARGS`` on a
     warm local cluster (started once before the rounds if it is not running; stopped at the end only if
     this script started it). The events come from ``raytrain jobs logs ID -v``.
  B  ``python -m torch.distributed.run --standalone --nproc_per_node 2 bench/bare_runner.py PLAN.json`` with
     the plan ``raytrain submit ... --dry-run --json`` resolves for the same flags (the exact DeepSpeed dict):
     the job's ``train(ctx)`` with a Ray-free context, the engine from ``build_engine``, the same event lines.

raytrain's CPU workers run with the jemalloc Ray ships (on raytrain's own nodes); B runs as torchrun does, with
glibc's malloc, unless ``--bare-jemalloc`` preloads the same library for B: A/B is then the overhead at the
same allocator. The table's first column says which each side had. ``--bare-ray`` also connects each of B's
processes to the same local cluster as a Ray driver before it trains (an idle Ray core worker in the training
process, as every Ray Train worker has): with both options, A/B is the cost raytrain and Ray Train add beyond
running inside a Ray process at all.

Figures per config (medians over rounds; [min, max] in the JSON): steady-state step time (median
``step_time_s`` after the first --warmup steps) and A/B; time from command start to the end of step 1 and
A/B; end-to-end wall time; peak RSS per worker; and the largest loss difference between A and B of a round
(the two sides do the same arithmetic, so it should be 0 or tiny). Goals (issue 8): steady A/B <= 1.02,
first step A/B <= 1.5. Writes --out (JSON) and prints a markdown table on stdout.

``--guards-ab``: instead, the cost of raytrain's step guards: the non-finite guard (under ZeRO 1-3 a factor on
each loss; elsewhere one all-reduce of a flag per step, and without ZeRO a finiteness check of each gradient),
the heartbeat's phase marks, the straggler watch's compute
timing (every collective's wait timed) and a beat thread running the straggler rule every 2 s in the training
process (in a raytrain job the board and the watchdog live in other processes): side B twice, guards on vs off
(``BARE_RUNNER_NO_GUARD=1``, a switch of this benchmark's runner, not of raytrain; in raytrain
``--hang-timeout 0`` turns the watchdog and the timing off, the non-finite guard has no off switch),
alternating, no Ray cluster; goal on/off <= 1.01. ``--guards-ab --same-processes``: the same A/B inside the
same two processes (bench/guards_inproc.py: an engine with every guard and one without; ``--rounds`` pairs of
``--inproc-steps``-step rounds, the order alternating, run once with each engine built first), which keeps
load that drifts between runs out of the ratio: the median of the pairs' ratios with a 95 % confidence
interval, and the guards' own seconds per step timed inside the guarded steps (over the plain step time: a
figure that resolves far below the A/B's spread on a loaded machine). ``--guards-only COMPONENT``: the same
A/B with one component on (nonfinite, marks, timing, beat; or all, or none: the A/B's null) and no timers
inside, with the extra CPU seconds per step of both processes (every thread: gloo's, the beat thread).
``--same-engine`` (with ``--same-processes``, also with ``--guards-only``): one engine per process instead of
two, the guard and the phase marks taken off and put back on it between rounds (the engine's instance
attributes and the marks' hook), so that two engines' memory layouts stay out of the ratio; run once (no
build order), ``--rounds`` pairs (default 80: as many as the two build orders' 2 x 40).

Uses the local cluster of the calling environment (RAYTRAIN_HOME, RAYTRAIN_PORT, RAYTRAIN_DASHBOARD_PORT,
RAYTRAIN_RAY_TEMP_DIR).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

# The job's arguments: a model whose step takes long enough on 2 CPU cores that per-step overheads show
# as a fraction of real work, not of nothing.
DEFAULT_JOB_ARGS = "--steps 30 --vocab 512 --dim 128 --layers 4 --heads 4 --seq 64"
SMOKE_JOB_ARGS = "--steps 6"
GOAL_STEADY, GOAL_FIRST = 1.02, 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default="jobs/gpt_zero.py", help="job file (default: %(default)s)")
    p.add_argument("--job-args", default=None, help=f"the job's arguments (default: {DEFAULT_JOB_ARGS!r})")
    p.add_argument("--rounds", type=int, default=None, help="A B rounds per config (default 3; --smoke 1)")
    p.add_argument("--zero", type=int, nargs="+", default=None, help="ZeRO stages (default 1 3; --smoke 1)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=None, help="steps left out of the steady state (default 3; --smoke 2)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to raytrain submit --env for side A (e.g. RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.05)")
    p.add_argument("--bare-env", action="append", default=[], metavar="KEY=VALUE", help="set for side B only")
    p.add_argument("--bare-jemalloc", action="store_true",
                   help="side B with Ray's jemalloc preloaded, as raytrain's CPU workers run: A/B is then the "
                        "overhead at the same allocator (default: B as torchrun runs, with glibc's malloc)")
    p.add_argument("--bare-ray", action="store_true",
                   help="side B's processes each connected to the local cluster as a Ray driver (an idle Ray core "
                        "worker in each training process)")
    p.add_argument("--bare-nice", type=int, default=0,
                   help="run side B at this niceness (Ray runs its train workers at 15; default %(default)s)")
    p.add_argument("--num-cpus", type=float, default=None, help="cluster up --num-cpus, if this script starts it")
    p.add_argument("--keep-cluster", action="store_true", help="leave the cluster up even if this script started it")
    p.add_argument("--no-warm-up", action="store_true",
                   help="when this script starts the cluster, do not run the uncounted warm-up job first")
    p.add_argument("--out", default="bench/results/overhead.json")
    p.add_argument("--smoke", action="store_true", help="one round, few steps, ZeRO 1 only")
    p.add_argument("--guards-ab", action="store_true",
                   help="steady step with raytrain's step guards on vs off (torchrun side only, no cluster)")
    p.add_argument("--same-processes", action="store_true",
                   help="--guards-ab in the same two processes, rounds alternating between an engine with every "
                        "guard and one without (bench/guards_inproc.py): load that drifts stays out of the ratio")
    p.add_argument("--inproc-model", default="512,4,32", metavar="DIM,LAYERS,BATCH",
                   help="--same-processes: the MLP (default %(default)s)")
    p.add_argument("--guards-only", default=None, choices=["all", "none", "nonfinite", "marks", "timing", "beat"],
                   help="--same-processes: the guarded side gets only this component (all: every one; none: the "
                        "A/B's null), with no timers inside; its paired ratio and the extra CPU of both processes")
    p.add_argument("--inproc-steps", type=int, default=5,
                   help="--same-processes: steps per round (--rounds: pairs of rounds per build order, default 40)")
    p.add_argument("--same-engine", action="store_true",
                   help="--same-processes: one engine per process, the guard and the phase marks taken off and "
                        "put back on it between rounds (instead of a guarded and a plain engine, whose memory "
                        "layouts move the ratio); no build orders, --rounds pairs (default 80)")
    args = p.parse_args(argv)
    if args.same_engine and not (args.guards_ab and args.same_processes):
        p.error("--same-engine needs --guards-ab --same-processes")
    if args.rounds is None:  # --same-processes: pairs of short rounds per build order
        args.rounds = (40 if args.same_processes else 3) if not args.smoke else (6 if args.same_processes else 1)
        if args.same_engine:  # one run instead of one per build order: as many pairs in all
            args.rounds *= 2
    if args.zero is None:
        args.zero = [1] if args.smoke else [1, 3]
    if args.warmup is None:
        args.warmup = 2 if args.smoke else 3
    if args.job_args is None:
        args.job_args = SMOKE_JOB_ARGS if args.smoke else DEFAULT_JOB_ARGS
    return args


def summarise(runs: list[bl.Run], warmup: int) -> dict:
    a = [r for r in runs if r.side == "raytrain" and r.ok]
    b = [r for r in runs if r.side == "torchrun" and r.ok]

    def med(side, attr):
        return bl.median([getattr(r, attr) for r in side])

    out = {"rounds_ok": {"raytrain": len(a), "torchrun": len(b)}}
    for attr in ("steady_step_s", "first_step_s", "wall_s", "steady_samples_per_s", "train_elapsed_s",
                 "job_start_s", "ctx_ready_s", "teardown_s", "job_end_s"):
        out[attr] = {
            "raytrain": med(a, attr), "torchrun": med(b, attr),
            "raytrain_range": bl.spread([getattr(r, attr) for r in a]),
            "torchrun_range": bl.spread([getattr(r, attr) for r in b]),
            "ratio": bl.ratio(med(a, attr), med(b, attr)),
        }
    out["allocator"] = {side: ",".join(sorted({r.allocator or "?" for r in rs})) or None
                        for side, rs in (("raytrain", a), ("torchrun", b))}
    out["steady_cpu_cores"] = {
        side: {k: bl.median([(r.steady_cpu or {}).get(k) for r in rs]) for k in ("workers", "other")}
        for side, rs in (("raytrain", a), ("torchrun", b))
    }
    # Pooled steady steps (all rounds together): the same median over more samples.
    pooled = {side: bl.median([t for r in rs for t in r.step_times[warmup:]]) for side, rs in (("raytrain", a), ("torchrun", b))}
    out["steady_step_s_pooled"] = {**pooled, "ratio": bl.ratio(pooled["raytrain"], pooled["torchrun"])}
    for side, rs in (("raytrain", a), ("torchrun", b)):
        ranks = sorted({k for r in rs for k in r.rss_peak_gb})
        out.setdefault("rss_peak_gb", {})[side] = {k: max(r.rss_peak_gb.get(k, 0) for r in rs) for k in ranks}
    diffs = []
    for rnd in sorted({r.round for r in runs}):
        ra = next((r for r in a if r.round == rnd), None)
        rb = next((r for r in b if r.round == rnd), None)
        if ra and rb and ra.losses and len(ra.losses) == len(rb.losses):
            diffs.append(max(abs(x - y) for x, y in zip(ra.losses, rb.losses)))
    out["loss_max_abs_diff"] = max(diffs) if diffs else None
    steady, first = out["steady_step_s"]["ratio"], out["first_step_s"]["ratio"]
    out["goals"] = {
        "steady_ratio_max": GOAL_STEADY, "steady_ok": steady is not None and steady <= GOAL_STEADY,
        "first_step_ratio_max": GOAL_FIRST, "first_step_ok": first is not None and first <= GOAL_FIRST,
    }
    return out


def diff(a, b):
    return a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def table(results: dict) -> str:
    header = ["config", "malloc A / B", "steady step A", "steady step B", "A/B", "A-B", "first step A",
              "first step B", "A/B", "wall A", "wall B", "peak RSS/worker A", "peak RSS/worker B", "max loss diff"]
    rows = []
    for label, cfg in results["configs"].items():
        s = cfg["summary"]

        def rss(side):
            values = s["rss_peak_gb"].get(side) or {}
            return " / ".join(f"{v:.2f}" for _, v in sorted(values.items())) + " GB" if values else "-"

        rows.append([
            label, f"{s['allocator']['raytrain'] or '-'} / {s['allocator']['torchrun'] or '-'}",
            bl.fmt(s["steady_step_s"]["raytrain"], " ms", 0, 1000), bl.fmt(s["steady_step_s"]["torchrun"], " ms", 0, 1000),
            bl.fmt(s["steady_step_s"]["ratio"], "", 3),
            bl.fmt(diff(s["steady_step_s"]["raytrain"], s["steady_step_s"]["torchrun"]), " ms", 1, 1000),
            bl.fmt(s["first_step_s"]["raytrain"], " s", 1), bl.fmt(s["first_step_s"]["torchrun"], " s", 1),
            bl.fmt(s["first_step_s"]["ratio"], "", 2),
            bl.fmt(s["wall_s"]["raytrain"], " s", 1), bl.fmt(s["wall_s"]["torchrun"], " s", 1),
            rss("raytrain"), rss("torchrun"),
            bl.fmt(s["loss_max_abs_diff"], "", 2 if not s["loss_max_abs_diff"] else 6),
        ])
    return bl.markdown_table(header, rows)


def startup_table(results: dict) -> str:
    """Where the time outside the training steps goes (medians, seconds from command start)."""
    header = ["config", "side", "job accepted", "train ctx built", "step 1 done", "last step done", "job ended",
              "teardown", "wall", "steady CPU: workers / other"]
    rows = []
    for label, cfg in results["configs"].items():
        s = cfg["summary"]
        for side in ("raytrain", "torchrun"):
            last = bl.median([r["last_step_s"] for r in cfg["runs"] if r["side"] == side and r["ok"]])
            rows.append([label, side, bl.fmt(s["job_start_s"][side], " s", 1), bl.fmt(s["ctx_ready_s"][side], " s", 1),
                         bl.fmt(s["first_step_s"][side], " s", 1), bl.fmt(last, " s", 1),
                         bl.fmt(s["job_end_s"][side], " s", 1),
                         bl.fmt(s["teardown_s"][side], " s", 1), bl.fmt(s["wall_s"][side], " s", 1),
                         f"{bl.fmt(s['steady_cpu_cores'][side]['workers'], '', 2)} / "
                         f"{bl.fmt(s['steady_cpu_cores'][side]['other'], '', 2)} cores"])
    return bl.markdown_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    job = str(Path(args.job).resolve())
    job_args = args.job_args.split()
    bare_extra = dict(kv.split("=", 1) for kv in args.bare_env)
    if args.bare_jemalloc:
        bare_extra.update(bl.jemalloc_preload())
    configs = {}
    for zero in args.zero:
        extra = [x for kv in args.env for x in ("--env", kv)]
        flags = bl.submit_flags(workers=args.workers, zero=zero, precision=args.precision,
                                grad_accum=args.grad_accum, micro_batch=args.micro_batch, extra=extra)
        request = bl.dry_run_plan(job, flags, job_args, env)
        configs[f"zero{zero}"] = {"flags": flags, "plan": request["plan"], "deepspeed": request["deepspeed"], "runs": []}

    if args.guards_ab and args.same_processes:
        return guards_same_processes(args)
    if args.guards_ab:
        return guards_ab(args, configs, env, bare_extra)
    bl.log(f"overhead: {len(configs)} config(s) x {args.rounds} round(s), job {args.job} {args.job_args}")
    started = bl.cluster_up(env, args.num_cpus)
    bl.log("overhead: local cluster " + ("started" if started else "already running (warm)"))
    if args.bare_ray:
        bare_extra.update(bl.ray_driver_env(env))
    t_start = time.time()
    try:
        if started and not args.no_warm_up:
            # The first job on a fresh cluster pays one-off costs (the detached autoscaling coordinator actor,
            # cold page cache for torch/deepspeed, the runtime-env agent's first package): not measured.
            first = next(iter(configs.values()))
            warm = bl.run_raytrain(job, first["flags"], job_args, env, label="warm-up", rnd=-1, warmup=args.warmup)
            bl.log(f"overhead: warm-up job on the fresh cluster: {'ok' if warm.ok else warm.error}, "
                   f"first step {bl.fmt(warm.first_step_s, ' s', 1)} (not counted)")
        for rnd in range(args.rounds):
            for label, cfg in configs.items():
                for side in ("raytrain", "torchrun"):
                    if side == "raytrain":
                        run = bl.run_raytrain(job, cfg["flags"], job_args, env, label=label, rnd=rnd, warmup=args.warmup)
                    else:
                        run = bl.run_bare(cfg["plan"], env, label=label, rnd=rnd, warmup=args.warmup,
                                          nice=args.bare_nice, extra_env=bare_extra)
                    cfg["runs"].append(run)
                    bl.log(f"overhead: round {rnd + 1} {label} {side:8s} "
                           + (f"steps {run.steps}, steady {bl.fmt(run.steady_step_s, ' s', 3)}, "
                              f"first step {bl.fmt(run.first_step_s, ' s', 1)}, wall {bl.fmt(run.wall_s, ' s', 1)}"
                              if run.ok else f"FAILED: {run.error}"))
    finally:
        if started and not args.keep_cluster:
            bl.cluster_down(env)
            bl.log("overhead: local cluster stopped")

    results = {
        "benchmark": "overhead",
        "machine": bl.machine(),
        "settings": {
            "job": args.job, "job_args": job_args, "workers": args.workers, "precision": args.precision,
            "grad_accum": args.grad_accum, "micro_batch": args.micro_batch, "rounds": args.rounds,
            "warmup_steps": args.warmup, "env": args.env, "bare_env": args.bare_env,
            "bare_jemalloc": args.bare_jemalloc, "bare_ray": args.bare_ray, "bare_nice": args.bare_nice, "smoke": args.smoke, "cluster_started_here": started,
            "duration_s": round(time.time() - t_start, 1),
        },
        "configs": {},
    }
    for label, cfg in configs.items():
        results["configs"][label] = {
            "flags": cfg["flags"], "deepspeed": cfg["deepspeed"],
            "summary": summarise(cfg["runs"], args.warmup),
            "runs": [r.to_dict() for r in cfg["runs"]],
        }
    path = bl.write_json(args.out, results)
    print(f"## raytrain vs torchrun: {args.workers} CPU workers, {args.precision}, grad-accum {args.grad_accum}, "
          f"{args.rounds} round(s), `{args.job} {args.job_args}`\n")
    print(table(results))
    print("\nWhere the time goes (median seconds from command start; cores used during the steady steps by the "
          "training processes and by every other process on the machine):\n")
    print(startup_table(results))
    print(f"\nmedians over rounds; steady = median step_time_s after {args.warmup} warm-up steps; first step = "
          f"command start to the end of step 1. Goals: steady A/B <= {GOAL_STEADY}, first step A/B <= {GOAL_FIRST}.")
    print(f"JSON: {path}")
    failed = [r for c in configs.values() for r in c["runs"] if not r.ok]
    return 1 if failed else 0


GOAL_GUARDS = 1.01


def guards_ab(args: argparse.Namespace, configs: dict, env: dict[str, str], bare_extra: dict[str, str]) -> int:
    """Steady step time with the guards on (A) vs off (B), both under torchrun, alternating per round."""
    results: dict = {"benchmark": "guards", "machine": bl.machine(), "job": args.job, "job_args": args.job_args,
                     "rounds": args.rounds, "warmup_steps": args.warmup, "configs": {}}
    rows = []
    for label, cfg in configs.items():
        on, off = [], []
        for rnd in range(args.rounds):
            for side, runs, extra in (("on", on, {}), ("off", off, {"BARE_RUNNER_NO_GUARD": "1"})):
                run = bl.run_bare(cfg["plan"], env, label=f"{label}-guards-{side}", rnd=rnd, warmup=args.warmup,
                                  nice=args.bare_nice, extra_env={**bare_extra, **extra})
                runs.append(run)
                bl.log(f"guards: round {rnd + 1} {label} guards {side:3s} "
                       + (f"steady {bl.fmt(run.steady_step_s, ' s', 4)}" if run.ok else f"FAILED: {run.error}"))
        a = bl.median([r.steady_step_s for r in on if r.ok and r.steady_step_s])
        b = bl.median([r.steady_step_s for r in off if r.ok and r.steady_step_s])
        pairs = [bl.ratio(x.steady_step_s, y.steady_step_s) for x, y in zip(on, off) if x.ok and y.ok]
        # with --bare-env BARE_RUNNER_GUARD_TIMING=1: the guard's own seconds and the timed waits per step
        timing = [t for r in on if r.ok for t in (r.extra.get("guard_timing") or {}).values() if t.get("steps")]
        guard_ms = bl.median([1000 * t["guard_s"] / t["steps"] for t in timing])
        waits = bl.median([t["waits"] / t["steps"] for t in timing])
        results["configs"][label] = {"flags": cfg["flags"], "steady_on_s": a, "steady_off_s": b,
                                     "ratio": bl.ratio(a, b), "round_ratios": pairs,
                                     "guard_ms_per_step": guard_ms, "timed_waits_per_step": waits,
                                     "runs": [r.to_dict() for r in on + off]}
        rows.append([label, bl.fmt(a, " s", 4), bl.fmt(b, " s", 4), bl.fmt(bl.ratio(a, b), "", 3),
                     ", ".join(bl.fmt(p, "", 3) for p in pairs), bl.fmt(guard_ms, " ms", 2), bl.fmt(waits, "", 0)])
    path = bl.write_json(args.out, results)
    print(f"## step guards on vs off: {args.workers} CPU workers (torchrun), {args.precision}, "
          f"grad-accum {args.grad_accum}, {args.rounds} round(s), `{args.job} {args.job_args}`\n")
    print(bl.markdown_table(["config", "steady, guards on", "steady, off", "on/off", "per round",
                             "non-finite guard per step", "timed waits per step"], rows))
    print(f"\nmedians over rounds of the median step_time_s after {args.warmup} warm-up steps. Goal: on/off <= "
          f"{GOAL_GUARDS}.\nJSON: {path}")
    failed = [r for c in results["configs"].values() for r in c["runs"] if not r["ok"]]
    return 1 if failed else 0


def guards_same_processes(args: argparse.Namespace) -> int:
    """Every guard on vs off inside the same two processes (bench/guards_inproc.py): the paired A/B with its
    confidence interval, and the guards' own seconds per step timed inside the guarded steps."""
    import guards_inproc

    dim, layers, batch = (int(v) for v in args.inproc_model.split(","))
    rows, parts, results = [], [], {"benchmark": "guards-same-processes", "machine": bl.machine(), "configs": {},
                                    "same_engine": args.same_engine}
    checks = []
    where = "same engine" if args.same_engine else "same processes"

    def by_order(r: dict) -> str:
        return ", ".join(f"{'same engine' if o == guards_inproc.SAME_ENGINE else o[:1]}: {v['paired_ratio']:.4f}"
                         for o, v in r["orders"].items())

    for zero in args.zero:
        r = guards_inproc.measure(zero=zero, steps=args.inproc_steps, rounds=args.rounds, dim=dim, layers=layers,
                                  batch=batch, only=args.guards_only, same_engine=args.same_engine)
        results["configs"][f"zero{zero}"] = r
        if r["toggle_check"]:
            c = r["toggle_check"][0]
            nan = {True: "skipped", None: "not checked (no guard on)"}[c["nan_step_skipped"]]
            checks.append(f"zero{zero}: off = the class's own methods, no hook (each rank); on, a NaN loss's step "
                          f"{nan}; toggled: {', '.join(c['attributes']) or 'no attribute'}; "
                          f"hooks: {', '.join(c['hooks']) or 'none'}")
        if args.guards_only is not None:
            low, high = r["paired_ratio_ci95"]
            clow, chigh = r["cpu_extra_ci95"]
            bl.log(f"guards ({where}, only {args.guards_only}): zero{zero} paired on/off "
                   f"{r['paired_ratio']:.4f} [{bl.fmt(low, '', 4)}, {bl.fmt(high, '', 4)}]")
            rows.append([f"zero{zero}", args.guards_only, bl.fmt(r["steady_off_s"], " ms", 2, 1000),
                         f"{r['paired_ratio']:.4f} [{bl.fmt(low, '', 4)}, {bl.fmt(high, '', 4)}]",
                         by_order(r),
                         f"{r['cpu_extra_s'] * 1000:.3f} [{bl.fmt(clow, '', 3, 1000)}, {bl.fmt(chigh, '', 3, 1000)}] ms"
                         f" of {r['cpu_off_s'] * 1000:.1f} ms"])
            continue
        g, (low, high) = r["guard_time"], r["paired_ratio_ci95"]
        bl.log(f"guards ({where}): zero{zero} paired on/off {r['paired_ratio']:.4f} "
               f"[{bl.fmt(low, '', 4)}, {bl.fmt(high, '', 4)}], guards' own time {g['total_ms']:.3f} ms/step "
               f"= {g['fraction_of_step'] * 100:.2f} % of {r['steady_off_s'] * 1000:.1f} ms")
        rows.append([f"zero{zero}", bl.fmt(r["steady_on_s"], " ms", 2, 1000), bl.fmt(r["steady_off_s"], " ms", 2, 1000),
                     bl.fmt(r["ratio"], "", 4),
                     f"{r['paired_ratio']:.4f} [{bl.fmt(low, '', 4)}, {bl.fmt(high, '', 4)}]",
                     by_order(r),
                     f"{g['total_ms']:.3f} ms ({g['fraction_of_step'] * 100:.2f} %)",
                     f"{g['total_cpu_ms']:.3f} ms ({g['cpu_fraction_of_step'] * 100:.2f} %)", f"{r['guard_ratio']:.4f}"])
        parts.append([f"zero{zero}", f"{g['nonfinite_guard_ms']:.3f} / {g['nonfinite_guard_cpu_ms']:.3f} ms",
                      f"{g['nonfinite_agree_ms']:.3f} / {g['nonfinite_agree_cpu_ms']:.3f} ms",
                      f"{g['phase_marks_ms'] * 1000:.1f} us", f"{g['step_finished_ms'] * 1000:.1f} us",
                      f"{g['timed_waits_per_step']:.0f} x {g['wait_overhead_us']:.2f} us",
                      f"{g['beat_thread_ms'] * 1000:.1f} us"])
    results["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    path = bl.write_json(args.out, results)
    rounds = (f"{args.rounds} pairs of {args.inproc_steps}-step rounds on the same engine (the guards taken off and "
              f"put back)" if args.same_engine else f"{args.rounds} pairs of {args.inproc_steps}-step rounds per "
              f"build order")
    checked = "".join(f"\nToggle check, {c}" for c in checks)
    if args.guards_only is not None:
        print(f"## guards on ({args.guards_only}) vs off, same 2 CPU processes, MLP {dim} x {layers}, batch {batch}; "
              f"{rounds}; load average "
              f"{results['machine']['load_avg'][0]} -> {results['machine']['load_avg_end'][0]}\n")
        print(bl.markdown_table(["config", "on", "plain step", "paired on/off [95 % CI]", "by build order",
                                 "extra CPU per step, both processes [95 % CI]"], rows))
        print(f"{checked[1:]}\nJSON: {path}" if checked else f"JSON: {path}")
        return 0
    print(f"## every guard on vs off, same 2 CPU processes (gloo, fp32), MLP {dim} x {layers} layers, batch {batch}; "
          f"{rounds}{'' if args.same_engine else ', both orders'}; load average "
          f"{results['machine']['load_avg'][0]} -> {results['machine']['load_avg_end'][0]}\n")
    print(bl.markdown_table(["config", "steady, guards on", "steady, off", "on/off (pooled)",
                             "paired on/off, median [95 % CI]",
                             "by build order (same engine)" if args.same_engine
                             else "by build order (plain first, guarded first)",
                             "guards' own time per step (wall)", "the same, CPU", "1 + own wall time / step"],
                            rows))
    print("\nThe guards' own time per step (medians over the guarded steps, the larger rank's; wall / CPU; the wall "
          "time of an all-reduce includes waiting for the other rank):\n")
    print(bl.markdown_table(["config", "non-finite guard", "of which agree (all-reduce)", "phase marks",
                             "step_finished", "timed waits x wrapper cost", "beat thread CPU"], parts))
    print(f"{checked}\n\nGoal: on/off <= {GOAL_GUARDS}.\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
