"""What `raytrain jobs status` pays to read a long run's events: the job's log and the run's record of N steps,
written as a job writes them, read by raytrain's code against a floor measured in the same run.

    .venv/bin/python bench/long_log.py                    # 200,000 steps, 3 rounds (about 1 min)
    .venv/bin/python bench/long_log.py --steps 20000 --rounds 1

Per round, in-process (no cluster; the log's download over the dashboard is not included):
- floor: ``json.loads`` of each event once, nothing kept;
- facts: ``JobFacts.from_lines`` of the job's log (what `jobs status` builds), and the same with each event
  told from its copies by its serialised content (``JobFacts.add(event)``, how it was built before 2026-12-07);
- ended job: ``api.with_recorded_steps`` of a finished job whose log has every step (what `jobs status` adds
  for an ended job: a look at the end of rank 0's record), against reading the whole record.
Goal: facts within 2x the floor; the ended job's look at the record under 1 % of reading it whole.
Writes --out (JSON) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402

from raytrain import api, run_record  # noqa: E402
from raytrain.events import FINISHED, MEMORY, METRICS, STARTED, JobFacts, format_event, parse_events  # noqa: E402
from raytrain.status import JobInfo, JobState  # noqa: E402

T0 = 1_790_000_000.0


def metrics(step: int) -> dict:
    """A rank-0 metrics event's fields as the reporter writes them for a train(ctx) job."""
    return {"step": step, "loss": 2.0 / (1 + step * 1e-4), "lr": 3e-4, "grad_norm": 0.51234, "samples": step * 32,
            "samples_per_s": 812.4, "step_time_s": 0.0394, "elapsed_s": round(step * 0.04, 3),
            "wall_time": round(T0 + step * 0.04, 3), "data_wait_s": 0.0012}


def write_run(root: Path, steps: int) -> tuple[list[str], Path]:
    """The job's log lines (Ray's worker prefix on rank 0's) and the run's record folder."""
    log = [format_event(STARTED, name="long", workers=2, zero=1, precision="bf16", train_batch=32)]
    rank0 = []
    for step in range(1, steps + 1):
        line = format_event(METRICS, **metrics(step))
        log.append(f"(RayTrainWorker pid=4242) {line}")
        rank0.append(f"{T0 + step * 0.04:.6f} {line}")
        if step % 250 == 0:  # a memory event every 10 s
            mem = format_event(MEMORY, rank=0, source="rss", rss_peak=4_000_000_000 + step)
            log.append(f"(RayTrainWorker pid=4242) {mem}")
            rank0.append(f"{T0 + step * 0.04:.6f} {mem}")
    log.append(format_event(FINISHED, metrics=metrics(steps)))
    folder = root / "raytrain-long-1" / "raytrain"
    folder.mkdir(parents=True)
    (folder / "events-rank-0.log").write_text("\n".join(rank0) + "\n")
    (folder / "events-driver.log").write_text(f"{T0:.6f} {log[0]}\n{T0 + steps * 0.04 + 1:.6f} {log[-1]}\n")
    return log, folder


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def floor(lines: list[str]) -> None:
    for line in lines:
        at = line.find("@@raytrain ")
        if at >= 0:
            json.loads(line[at + len("@@raytrain "):])


def by_content(lines: list[str]) -> JobFacts:
    facts = JobFacts()
    for line in lines:
        for event in parse_events(line):
            facts.add(event)
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(bl.BENCH / "results" / "long_log.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="raytrain-long-log-") as tmp:
        log, folder = write_run(Path(tmp), args.steps)
        size = sum(len(line) + 1 for line in log)
        rows: dict[str, list[float]] = {"floor": [], "facts": [], "by_content": [], "ended": [], "record": []}
        for _ in range(args.rounds):
            rows["floor"].append(timed(lambda: floor(log)))
            facts = JobFacts.from_lines(log)
            rows["facts"].append(timed(lambda: JobFacts.from_lines(log)))
            rows["by_content"].append(timed(lambda: by_content(log)))
            assert facts.last_metrics["step"] == args.steps
            info = JobInfo(job_id="raytrain-long-1", name="long", state=JobState.SUCCEEDED, target="local",
                           address="", facts=facts)
            rows["ended"].append(timed(lambda: api.with_recorded_steps(info, tmp)))
            rows["record"].append(timed(lambda: JobFacts.from_lines(run_record.read_lines(folder))))
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {"steps": args.steps, "log_bytes": size, "seconds": rows, "median_s": med,
              "facts_over_floor": bl.ratio(med["facts"], med["floor"]),
              "by_content_over_floor": bl.ratio(med["by_content"], med["floor"]),
              "ended_over_record": bl.ratio(med["ended"], med["record"]), "machine": bl.machine()}
    bl.write_json(args.out, result)
    print(f"{args.steps} steps, a {size / 1e6:.0f} MB log, median of {args.rounds} round(s):\n")
    print(bl.markdown_table(["what", "s", "ratio"], [
        ["floor: json.loads of each event", f"{med['floor']:.2f}", "1"],
        ["JobFacts.from_lines of the log", f"{med['facts']:.2f}", f"{result['facts_over_floor']:.2f} of the floor"],
        ["the same, events told by content", f"{med['by_content']:.2f}",
         f"{result['by_content_over_floor']:.2f} of the floor"],
        ["reading the whole record", f"{med['record']:.2f}", "1"],
        ["with_recorded_steps, log whole", f"{med['ended']:.4f}",
         f"{result['ended_over_record']:.4f} of reading the record"],
    ]))


if __name__ == "__main__":
    main()
