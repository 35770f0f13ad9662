"""CPU an idle local cluster takes (every process of the head: GCS, raylet, dashboard and its modules, agents,
log monitor), with raytrain's settings against Ray's defaults, measured in the same script.

    .venv/bin/python bench/idle_cluster.py                 # 2 rounds x 60 s per side, about 6 min
    .venv/bin/python bench/idle_cluster.py --seconds 20 --rounds 1

For each round and side (A: raytrain's settings, the default; B: ``RAYTRAIN_RAY_TUNING=off``, Ray's own
defaults) it starts a local cluster on private ports and a private RAYTRAIN_HOME, lets it settle, sums the
CPU time (/proc) of every process under ``ray start`` over the window, and stops it. Reports percent of one
core (median over rounds), A/B, and the busiest processes; also the niceness Ray gives a worker process.
Goal (issue 18): A at most half of B. Writes --out (JSON) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402


def process_tree(root: int) -> dict[int, tuple[str, float, int]]:
    """pid -> (command, CPU seconds so far, niceness) for ``root`` and all its descendants."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    info: dict[int, tuple[str, float, int]] = {}
    hz = os.sysconf("SC_CLK_TCK")
    for pid, fields, cmd in bl.processes():
        kids[int(fields[1])].append(pid)
        info[pid] = (cmd, (int(fields[11]) + int(fields[12])) / hz, int(fields[16]))
    out, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in info:
            out[pid] = info[pid]
        stack += kids.get(pid, [])
    return out


def short(cmd: str) -> str:
    for mark in ("gcs_server", "raylet", "dashboard.py", "log_monitor", "DashboardAgent", "runtime_env",
                 "ray.util.client.server", "monitor.py", "ray_dashboard", "ray_start", "forkserver"):
        if mark in cmd:
            return {"ray_dashboard": "dashboard.py", "ray_start": "ray start"}.get(mark, mark)
    if cmd.startswith("ray-dashboard-"):
        return cmd.split(" ")[0]
    return cmd.split(" ")[0].rsplit("/", 1)[-1][:40]


def measure(side: str, seconds: float, settle: float, port: int) -> dict:
    home = tempfile.mkdtemp(prefix="raytrain-idle-")
    env = {**os.environ, "RAYTRAIN_HOME": home, "RAYTRAIN_PORT": str(port), "RAYTRAIN_DASHBOARD_PORT": str(port + 1900),
           "RAYTRAIN_RAY_TEMP_DIR": f"/tmp/rt-idle-{os.getuid()}-{port}"}
    env.pop("RAY_ADDRESS", None)
    if side == "ray-defaults":
        env["RAYTRAIN_RAY_TUNING"] = "off"
    t0 = time.monotonic()
    bl.cluster_up(env)
    up_s = time.monotonic() - t0
    try:
        import json

        pid = json.loads(Path(home, "cluster.json").read_text())["pid"]
        time.sleep(settle)
        before = process_tree(pid)
        time.sleep(seconds)
        after = process_tree(pid)
    finally:
        bl.cluster_down(env)
    per: dict[str, float] = collections.defaultdict(float)
    for p, (cmd, cpu, _nice) in after.items():
        per[short(cmd)] += cpu - before.get(p, (cmd, 0.0, 0))[1]
    total = sum(per.values())
    return {"side": side, "cpu_pct_of_one_core": round(100 * total / seconds, 2), "processes": len(after),
            "cluster_up_s": round(up_s, 1),
            "by_process": {k: round(100 * v / seconds, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="measuring window per run")
    p.add_argument("--settle", type=float, default=15.0, help="seconds after `cluster up` before measuring")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=6397)
    p.add_argument("--out", default="bench/results/idle_cluster.json")
    args = p.parse_args(argv)
    runs = []
    for rnd in range(args.rounds):
        for side in ("raytrain", "ray-defaults"):
            bl.log(f"round {rnd + 1}: {side}: measuring {args.seconds:.0f} s of an idle cluster")
            for attempt in (1, 2):  # on a busy machine `ray start` itself may time out: try once more
                try:
                    runs.append({"round": rnd + 1, **measure(side, args.seconds, args.settle, args.port)})
                    bl.log(f"  {runs[-1]['cpu_pct_of_one_core']} % of one core")
                    break
                except RuntimeError as exc:
                    bl.log(f"  attempt {attempt}: the cluster did not start: {str(exc).splitlines()[-1][:200]}")
    med = {s: statistics.median([r["cpu_pct_of_one_core"] for r in runs if r["side"] == s] or [float("nan")])
           for s in ("raytrain", "ray-defaults")}
    ratio = bl.ratio(med["raytrain"], med["ray-defaults"])
    data = {"machine": bl.machine(), "settings": vars(args), "runs": runs,
            "summary": {"cpu_pct": med, "ratio": ratio, "goal_ratio": 0.5,
                        "goal_ok": ratio is not None and ratio <= 0.5}}
    out = bl.write_json(args.out, data)
    print(bl.markdown_table(["side", "idle CPU (% of one core, median)", "A/B"],
                            [["raytrain", f"{med['raytrain']:.2f}", bl.fmt(ratio)],
                             ["ray-defaults", f"{med['ray-defaults']:.2f}", ""]]))
    last = [r for r in runs if r["side"] == "raytrain"][-1]
    print("busiest (raytrain side): " + ", ".join(f"{k} {v}%" for k, v in list(last["by_process"].items())[:6]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
