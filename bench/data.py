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

    .venv/bin/python bench/data.py --scale [--scale-gb 2] [--object-store-mb 400] [--out bench/results/data-scale.json]

``--scale``: a dataset larger than the object store. Generates --scale-gb of Parquet (--scale-files files of
rows {"id", "x": DIM float32 as bytes, "y"}; kept in --scale-dir for the next run), starts a local cluster
whose object store holds --object-store-mb (the cluster must not be running: the size is set at its start),
and trains one epoch of bench/jobs/data_scale.py on 2 CPU workers. Writes dataset_bytes (the Parquet
footers' uncompressed size), object_store_bytes, and per worker rows and bytes read (the sizes of the blocks
it fetched, counted by ctx.dataset) and peak RSS; goals: max(bytes_read_per_worker) / dataset_bytes <= 0.6,
data wait <= 5 % of step time, peak RSS per worker <= --rss-limit-gb.
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
    p.add_argument("--out", default=None, help="default bench/results/data.json (--scale: data-scale.json)")
    p.add_argument("--scale", action="store_true", help="one epoch of a dataset larger than the object store")
    p.add_argument("--scale-gb", type=float, default=2.0)
    p.add_argument("--scale-files", type=int, default=64)
    p.add_argument("--scale-dir", default="bench/results/scale-data")
    p.add_argument("--object-store-mb", type=float, default=400)
    p.add_argument("--dim", type=int, default=1024, help="--scale: float32 features per row")
    p.add_argument("--hidden", type=int, default=1024, help="--scale: the MLP's width")
    p.add_argument("--rss-limit-gb", type=float, default=1.5, help="--scale: the peak RSS goal per worker")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = "bench/results/data-scale.json" if args.scale else "bench/results/data.json"
    return args


SCALE_GOALS = {"read_share": 0.6, "data_wait": 0.05}


def generate(folder: Path, total_bytes: int, files: int, dim: int) -> dict:
    """--scale's dataset: ``files`` Parquet files of about total_bytes/files each (random, incompressible:
    the bytes on disk are the bytes read); reused when a previous run made the same one."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = folder.parent / f"{folder.name}.manifest.json"  # beside it: Ray Data reads every file inside
    wanted = {"total_bytes": total_bytes, "files": files, "dim": dim}
    if manifest.is_file() and json.loads(manifest.read_text()).get("wanted") == wanted:
        return json.loads(manifest.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    row_bytes = dim * 4 + 12
    rows_per_file = max(total_bytes // files // row_bytes, 1)
    rows = 0
    for i in range(files):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((rows_per_file, dim), dtype=np.float32)
        table = pa.table({
            "id": pa.array(np.arange(rows, rows + rows_per_file, dtype=np.int64)),
            "x": pa.array([r.tobytes() for r in x], type=pa.binary()),
            "y": pa.array(x[:, 0] > 0, type=pa.float32()),
        })
        pq.write_table(table, folder / f"part-{i:04d}.parquet", compression="none", row_group_size=4096)
        rows += rows_per_file
    info = {"wanted": wanted, "rows": rows}
    manifest.write_text(json.dumps(info))
    return info


def scale(args) -> int:
    import json

    sys.path.insert(0, str(bl.ROOT))
    from raytrain.config.data import measure

    folder = Path(args.scale_dir).resolve()
    bl.log(f"generating {args.scale_gb:g} GB of Parquet in {folder} (reused if there)")
    info = generate(folder, int(args.scale_gb * 1e9), args.scale_files, args.dim)
    dataset = measure({"path": str(folder), "format": "parquet"})
    on_disk = sum(f.stat().st_size for f in folder.glob("*.parquet"))
    env = dict(os.environ)
    import psutil

    # Ray sizes the object store as a share of the memory available at `ray start`: ask for --object-store-mb
    share = args.object_store_mb * 1e6 / psutil.virtual_memory().available
    env["RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION"] = f"{share:.6f}"
    started = bl.cluster_up(env, num_cpus=2)
    if not started:
        bl.log("a cluster was already running: its object store size is what it is (see object_store_bytes)")
    try:
        submit = ["--workers", "2", "--gpus-per-worker", "0", "--micro-batch", str(args.micro_batch),
                  "--data", f"train={folder}", "--prefetch", "4", "--timeout", "1800"]
        job = ["--dim", str(args.dim), "--hidden", str(args.hidden)]
        run = bl.run_raytrain("bench/jobs/data_scale.py", submit, job, env, label="scale", rnd=0,
                              warmup=args.warmup, timeout=3600)
        logs = bl.run_cli("jobs", "logs", run.job_id, env=env, timeout=120, check=False).stdout if run.job_id else ""
    finally:
        if started:
            bl.cluster_down(env)
    ranks = {}
    for line in logs.splitlines():
        if "@@scale " in line:
            stats = json.loads(line[line.index("@@scale ") + 8:])
            ranks[stats["rank"]] = stats
    metrics = [m for m in getattr(run, "metrics", []) if m.get("step", 0) > args.warmup]
    wait = sum(m.get("data_wait_s") or 0 for m in metrics)
    step = sum(m.get("step_time_s") or 0 for m in metrics)
    read = [ranks[r]["bytes_read"] for r in sorted(ranks)]
    store = next((r["object_store"] for r in ranks.values() if r.get("object_store")), None)
    summary = {
        "ok": run.ok, "error": run.error, "dataset_bytes": dataset["bytes"], "dataset_bytes_on_disk": on_disk,
        "dataset_rows": dataset["rows"], "object_store_bytes": store,
        "dataset_to_object_store": bl.ratio(dataset["bytes"], store),
        "bytes_read_per_worker": read, "rows_per_worker": [ranks[r]["rows"] for r in sorted(ranks)],
        "blocks_read_per_worker": [ranks[r]["blocks_read"] for r in sorted(ranks)],
        "blocks": next((r["blocks"] for r in ranks.values()), None),
        "read_share": bl.ratio(max(read), dataset["bytes"]) if read else None,
        "rss_peak_gb_per_worker": [round(ranks[r]["rss_peak"] / 1e9, 3) for r in sorted(ranks)],
        "rss_peak_gb_sampled": run.rss_peak_gb, "rss_limit_gb": args.rss_limit_gb,
        "steps": run.steps, "steady_step_s": run.steady_step_s,
        "data_wait_share": bl.ratio(wait, step),
        "data_wait_s_median": bl.median([m.get("data_wait_s") for m in metrics]),
        "wall_s": run.wall_s,
    }
    summary["goals"] = {
        "read_share_ok": summary["read_share"] is not None and summary["read_share"] <= SCALE_GOALS["read_share"],
        "data_wait_ok": (summary["data_wait_share"] is not None
                         and summary["data_wait_share"] <= SCALE_GOALS["data_wait"]),
        "rss_ok": bool(ranks) and max(summary["rss_peak_gb_per_worker"]) <= args.rss_limit_gb,
        "dataset_at_least_4x_object_store": (summary["dataset_to_object_store"] or 0) >= 4,
    }
    bl.write_json(args.out, {"machine": bl.machine(), "args": vars(args), "summary": summary,
                             "run": run.to_dict(), "ranks": ranks, "generated": info})
    print(bl.markdown_table(["figure", "value"], [[k, json.dumps(v)] for k, v in summary.items()]))
    return 0 if run.ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.scale:
        return scale(args)
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
