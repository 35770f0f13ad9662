"""What reading data through ``ctx.dataset`` costs a training step (issue 15).

    .venv/bin/python scripts/build_corpus.py --out data/stdlib.jsonl --tokenizer data/tokenizer.json
    .venv/bin/python bench/data.py [--corpus data/stdlib.jsonl] [--steps 60] [--rounds 1]

The same job (jobs/gpt_text.py: a small GPT, its corpus tokenized and packed by a Ray Data preprocess) three
ways, on 2 CPU workers of the running local cluster (started if none runs):

  stream      ``ctx.dataset`` with ``--prefetch 2``: batches cut, converted and copied ahead of the step
  no-prefetch ``ctx.dataset`` with ``--prefetch 0``: every batch prepared when the step asks for it
  memory      the same tensors, pulled from ``ctx.dataset`` before the first step and kept in a list

Figures: steady-state step time (median ``step_time_s`` after --warmup steps), its ratio to ``memory``,
the median ``data_wait_s`` per step, and the time from submit to the first step (the preprocessing streams:
the workers start once one global micro-batch is tokenized, not the whole corpus; ``memory`` pulls every
batch first, so its first step comes after the whole run's data). Goal: stream/memory <= 1.05. Writes --out (JSON), prints a
markdown table. Uses the cluster of the calling environment (RAYTRAIN_HOME, RAYTRAIN_PORT, ...).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

GOAL = 1.05
VARIANTS = {"stream": (["--prefetch", "2"], []), "no-prefetch": (["--prefetch", "0"], []),
            "memory": (["--prefetch", "2"], ["--in-memory"])}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default="data/stdlib.jsonl", help="built by scripts/build_corpus.py")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--job-args", default="--dim 128 --layers 2 --seq 64 --log-every 1000")
    p.add_argument("--out", default="bench/results/data.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    corpus = Path(args.corpus).resolve()
    if not corpus.is_file() or not (corpus.parent / "tokenizer.json").is_file():
        print(f"bench/data.py: build the corpus first: scripts/build_corpus.py --out {args.corpus} "
              f"--tokenizer {corpus.parent / 'tokenizer.json'}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    started = bl.cluster_up(env, num_cpus=2)
    runs: dict[str, list] = {name: [] for name in VARIANTS}
    try:
        for rnd in range(args.rounds):
            for name, (flags, job_args) in VARIANTS.items():
                submit = ["--workers", "2", "--gpus-per-worker", "0", "--micro-batch", str(args.micro_batch),
                          "--data", f"train={corpus}", *flags]
                job = [*args.job_args.split(), "--steps", str(args.steps), *job_args]
                bl.log(f"round {rnd + 1}: {name}")
                run = bl.run_raytrain("jobs/gpt_text.py", submit, job, env, label=name, rnd=rnd, warmup=args.warmup)
                steady = [m.get("data_wait_s") for m in getattr(run, "metrics", []) if m.get("step", 0) > args.warmup]
                run.extra["data_wait_s"] = bl.median(steady)
                runs[name].append(run)
                bl.log(f"  {name}: ok={run.ok} steady {run.steady_step_s} s/step, data wait {run.extra['data_wait_s']}"
                       + (f" error: {run.error}" if run.error else ""))
    finally:
        if started:
            bl.cluster_down(env)
    summary = {}
    memory = bl.median([r.steady_step_s for r in runs["memory"]])
    for name, rs in runs.items():
        step = bl.median([r.steady_step_s for r in rs])
        summary[name] = {"steady_step_s": step, "ratio_to_memory": bl.ratio(step, memory),
                         "data_wait_s": bl.median([r.extra.get("data_wait_s") for r in rs]),
                         "first_step_s": bl.median([r.first_step_s for r in rs]),
                         "loss_last": rs[-1].losses[-1] if rs and rs[-1].losses else None}
    bl.write_json(args.out, {"machine": bl.machine(), "args": vars(args), "summary": summary, "goal": GOAL,
                             "runs": {k: [r.to_dict() for r in v] for k, v in runs.items()}})
    rows = [[name, bl.fmt(s["steady_step_s"], " s", 3), bl.fmt(s["ratio_to_memory"], "", 3),
             bl.fmt(s["data_wait_s"], " ms", 1, 1000), bl.fmt(s["first_step_s"], " s", 1)]
            for name, s in summary.items()]
    print(bl.markdown_table(["variant", "steady step", "vs memory", "data wait/step", "submit to 1st step"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
