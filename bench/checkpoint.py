"""Training stall per checkpoint, --checkpoint-mode sync vs async, in one run on the local cluster.

    .venv/bin/python bench/checkpoint.py [--mparams 10] [--steps 24] [--checkpoint-every 4] [--out FILE]

Starts its own local cluster (own RAYTRAIN_HOME, free ports; stopped at the end) and runs bench/jobs/ckpt_stall.py
with 2 CPU workers, ZeRO 0, fp32, once per mode (sync first, then async, then both again with --rounds 2).
The stall of a mode is the median time of a step that saved a checkpoint less the median time of a step that did
not (both on rank 0's training thread, the step's own ctx.report included); the figure is async / sync (goal
<= 0.1). The losses of the two modes must be identical. Writes JSON (``--out``, default bench/results/checkpoint.json)
with ``stall_s`` per mode, the ratio, the state size and every step time.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import benchlib as bl  # noqa: E402

JOB = ROOT / "bench" / "jobs" / "ckpt_stall.py"


def free_port(avoid: set[int] = frozenset()) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], folder: Path, rnd: int) -> dict:
    times = folder / f"{mode}-{rnd}.json"
    flags = ["--workers", "2", "--gpus-per-worker", "0", "--zero", "0", "--precision", "fp32", "--micro-batch", "4",
             "--checkpoint-every", str(args.checkpoint_every), "--checkpoint-mode", mode, "--keep", "2"]
    started = time.time()
    proc = bl.run_cli("submit", JOB, *flags, "--json", "-q", "--", "--steps", args.steps, "--mparams", args.mparams,
                      "--times-out", times, env=env, timeout=1800)
    data = json.loads(times.read_text())
    step_s, saved = data["step_s"], data["saved"]
    warm = [(t, s) for i, (t, s) in enumerate(zip(step_s, saved)) if i >= 1]  # step 1 builds caches
    with_save = [t for t, s in warm if s]
    without = [t for t, s in warm if not s]
    stall = statistics.median(with_save) - statistics.median(without)
    bl.log(f"{mode}: step {statistics.median(without) * 1000:.1f} ms, with a save "
           f"{statistics.median(with_save) * 1000:.1f} ms: stall {stall * 1000:.1f} ms per checkpoint "
           f"(job {json.loads(proc.stdout)['id']}, {time.time() - started:.0f} s)")
    job = json.loads(proc.stdout)["id"]
    logs = bl.run_cli("jobs", "logs", job, "-v", env=env, timeout=120, check=False).stdout
    from raytrain.events import parse_line

    events = [e for e in map(parse_line, logs.splitlines()) if e and e.get("event") == "checkpoint"]
    return {"stall_s": stall, "step_s": statistics.median(without), "save_step_s": statistics.median(with_save),
            "wall_s": round(time.time() - started, 1), "job": job, "checkpoint_events": events,
            "losses": data["losses"], "state_bytes": data["state_bytes"], "all_step_s": step_s, "saved": saved}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mparams", type=float, default=10.0, help="millions of parameters (x12 bytes of state)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.json"))
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="raytrain-bench-ckpt-"))
    port = free_port()
    env = {**os.environ, "RAYTRAIN_HOME": str(home), "RAYTRAIN_PORT": str(port),
           "RAYTRAIN_DASHBOARD_PORT": str(free_port({port})), "PYTHONPATH": str(ROOT),
           "RAYTRAIN_RAY_TEMP_DIR": tempfile.mkdtemp(prefix="rt-", dir="/tmp")}
    bl.cluster_up(env, 2)
    try:
        runs: dict[str, list[dict]] = {"sync": [], "async": []}
        for rnd in range(args.rounds):
            for mode in ("sync", "async"):
                runs[mode].append(run_mode(mode, args, env, home, rnd))
    finally:
        bl.cluster_down(env)
    stall = {mode: statistics.median(r["stall_s"] for r in rs) for mode, rs in runs.items()}
    ratio = stall["async"] / stall["sync"] if stall["sync"] > 0 else None
    same = all(r["losses"] == runs["sync"][0]["losses"] for rs in runs.values() for r in rs)
    # the training thread's own share of an async save: its snapshot (the checkpoint events' snapshot_s); the
    # rest of the step-time stall is Ray Train's report (a collective) and the writer competing for the CPU
    snaps = [e["snapshot_s"] for r in runs["async"] for e in r["checkpoint_events"] if e.get("snapshot_s") is not None]
    snapshot_s = statistics.median(snaps) if snaps else None
    result = {
        "stall_s": {k: round(v, 4) for k, v in stall.items()},
        "async_over_sync": None if ratio is None else round(ratio, 4),
        "async_snapshot_s": None if snapshot_s is None else round(snapshot_s, 4),
        "snapshot_over_sync_stall": None if not (snapshot_s and stall["sync"] > 0) else round(snapshot_s / stall["sync"], 4),
        "identical_losses": same,
        "state_mb_per_rank": round(runs["sync"][0]["state_bytes"] / 1e6, 1),
        "args": vars(args), "machine": bl.machine(), "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    bl.write_json(args.out, result)
    print(f"stall per checkpoint: sync {stall['sync'] * 1000:.1f} ms, async {stall['async'] * 1000:.1f} ms; "
          f"async/sync {ratio if ratio is None else round(ratio, 3)}; identical losses: {same}; "
          f"{result['state_mb_per_rank']} MB of state per rank")
    print(json.dumps({k: result[k] for k in ("stall_s", "async_over_sync", "async_snapshot_s", "snapshot_over_sync_stall",
                                             "identical_losses", "state_mb_per_rank")}))
    return 0 if same and ratio is not None and ratio <= 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
