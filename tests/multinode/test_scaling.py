"""raytrain across two real Ray nodes (the ``two_nodes`` fixture: a head and node 2 in its own network
namespace, joined over a veth pair, 1 CPU each): placement, preflight, shared storage, elastic recovery."""
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import JOBS, ROOT

pytestmark = pytest.mark.multinode

GPT = JOBS / "gpt_zero.py"
SUBMITTED = re.compile(r"raytrain: submitted (\S+) to")
BASE = ["--zero", "3", "--precision", "fp32", "--micro-batch", "2", "--grad-accum", "2"]


def submit(cli, flags, job_args, timeout=420):
    return cli("submit", GPT, *flags, "--json", "--", *job_args, timeout=timeout)


def test_an_interface_that_does_not_exist_fails_in_seconds_naming_it(two_nodes):
    t0 = time.monotonic()
    proc = submit(two_nodes.cli, ["--workers", "2", "--placement", "spread", "--interface", "nosuch0", *BASE],
                  ["--steps", "2"])
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "--interface nosuch0" in err and "no interface 'nosuch0'" in err
    assert "10.213.0.2" in err and "10.213.0.1" in err  # both nodes named, with what they have
    assert "rt-mn1" in err and "rt-mn0" in err
    # Workers start in ~20-40 s on 2 cores; the point is not waiting for the process-group timeout (600 s).
    assert took < 150, took


def test_an_interface_that_cannot_reach_rank_0_fails_naming_the_node(two_nodes):
    # lo exists on both nodes, but from node 2 it cannot reach the head: the probe connection fails.
    proc = submit(two_nodes.cli, ["--workers", "2", "--placement", "spread", "--interface", "lo", *BASE],
                  ["--steps", "2"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "raytrain: error" in line)
    failing = re.findall(r"rank \d on \S+ \((10\.213\.0\.\d)\) cannot reach rank 0 at (10\.213\.0\.\d):\d+ via lo", line)
    # Exactly the node that is not rank 0's is named (rank 0's node reaches its own address over lo).
    assert len(failing) == 1 and failing[0][0] != failing[0][1], line


def test_node_local_storage_is_refused_before_any_worker_starts(two_nodes):
    storage = two_nodes.node_local_dir / "runs"
    t0 = time.monotonic()
    proc = submit(two_nodes.cli, ["--workers", "2", "--placement", "spread", "--storage", storage, *BASE],
                  ["--steps", "2"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--storage {storage} is node-local" in proc.stderr and "10.213.0.2" in proc.stderr
    assert time.monotonic() - t0 < 90
    assert not [p for p in storage.iterdir() if p.name.startswith(".raytrain-storage-check")]
    shutil.rmtree(storage)


def test_spread_puts_one_worker_on_each_node_and_trains(two_nodes):
    proc = submit(
        two_nodes.cli,
        ["--workers", "2", "--placement", "spread", "--storage", two_nodes.shared_dir, *BASE],
        ["--steps", "8"],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    facts = two_nodes.cli.facts(info["id"])
    pre = facts.preflight
    assert {w["ip"] for w in pre["workers"]} == {"10.213.0.1", "10.213.0.2"}, pre
    by_ip = {w["ip"]: w for w in pre["workers"]}
    # Each worker talks over its own end of the veth pair (set as GLOO_SOCKET_IFNAME for it).
    assert by_ip["10.213.0.1"]["interface"] == "rt-mn0" and by_ip["10.213.0.2"]["interface"] == "rt-mn1"
    rank0 = next(w for w in pre["workers"] if w["rank"] == 0)
    assert pre["master"] == rank0["ip"]
    losses = facts.losses
    assert len(losses) == 8 and losses[-1] < losses[0], losses
    assert "preflight ok" in proc.stderr and "2 worker(s) on 2 node(s)" in proc.stderr
    assert facts.started["storage_nodes"] == 2  # the shared folder passed the marker check on both nodes
    assert "every node (2) wrote a marker the driver read back" in proc.stderr


def _wait_for_checkpoint(cli, job_id, step, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        facts = cli.facts(job_id)
        if any(s >= step for s in facts.checkpoints):
            return facts
        if facts.error or facts.finished:
            raise AssertionError(f"job ended before checkpoint {step}: {facts.error or facts.finished}")
        time.sleep(1.0)
    raise AssertionError(f"no checkpoint at step >= {step} within {timeout_s} s")


def test_elastic_job_continues_on_one_worker_when_a_node_is_lost(two_nodes, request):
    request.addfinalizer(lambda: two_nodes.node2_alive() or two_nodes.start_node2())
    cli, shared = two_nodes.cli, two_nodes.shared_dir
    probe, ref_probe = shared / "elastic-probe.pt", shared / "reference-probe.pt"
    flags = ["--workers", "1-2", "--placement", "spread", "--storage", shared, "--checkpoint-every", "2", *BASE]
    # The user's view: `raytrain submit` following the job in the terminal.
    submit_proc = subprocess.Popen(
        [sys.executable, "-m", "raytrain.cli.main", "submit", GPT, *map(str, flags), "--",
         "--steps", "12", "--step-sleep", "1.5", "--probe-out", str(probe)],
        env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )
    request.addfinalizer(lambda: submit_proc.poll() is not None or submit_proc.kill())
    lines: list[str] = []

    def read():
        for line in submit_proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not (job_id := next((m.group(1) for m in map(SUBMITTED.search, list(lines)) if m), None)):
        assert time.monotonic() < deadline and submit_proc.poll() is None, "".join(lines)
        time.sleep(0.5)
    facts = _wait_for_checkpoint(cli, job_id, 4)
    assert facts.started["workers"] == "1-2"
    assert len({w["ip"] for w in facts.preflight["workers"]}) == 2  # it started on both nodes
    two_nodes.kill_node2()
    killed = time.monotonic()
    assert submit_proc.wait(timeout=420) == 0, "".join(lines)[-4000:]
    reader.join(timeout=10)
    terminal = "".join(lines)
    print(f"\nelastic: job finished {time.monotonic() - killed:.0f} s after node 2 was killed")
    assert "raytrain: workers restarting" in terminal
    assert "elastic: running on 1 worker(s) (range 1-2); grad-accum 4 (planned 2 on 2) keeps the global batch 8" in terminal
    logs = cli("jobs", "logs", job_id, check=True).stdout
    status = cli("jobs", "status", job_id, check=True).stdout
    assert "resized" in status and "elastic: running on 1 worker(s)" in status
    facts = cli.facts(job_id)
    assert facts.restarts >= 1
    resized = facts.resized[-1]
    assert resized["workers"] == 1 and resized["grad_accum"] == 4 and resized["train_batch"] == 8, resized
    restored = re.findall(r"restored step (\d+) from (\S+)", logs)
    assert restored, logs[-3000:]
    step, checkpoint = int(restored[-1][0]), restored[-1][1]
    assert step >= 4 and facts.metrics[-1]["step"] == 12
    assert "resharding ZeRO state" in logs

    # The same checkpoint continued by a plain 1-worker run gives the same model, bit for bit.
    ref = cli("submit", GPT, "--workers", "1", "--zero", "3", "--precision", "fp32", "--micro-batch", "2",
              "--grad-accum", "4", "--storage", shared, "--resume", checkpoint, "--json", "--",
              "--steps", "12", "--probe-out", ref_probe, timeout=420)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    ref_facts = cli.facts(json.loads(ref.stdout)["id"])
    assert ref_facts.metrics[-1]["loss"] == facts.metrics[-1]["loss"]
    assert torch.equal(torch.load(probe)["output"], torch.load(ref_probe)["output"])


def controller_decisions(cli) -> str:
    """Ray Train's controllers' own account of their scaling decisions and worker group starts (the head's
    session logs): what a test that finds the wrong group size shows."""
    logs = Path(cli.env["RAYTRAIN_RAY_TEMP_DIR"]).glob("**/session_latest/logs/train/ray-train-sys-controller-*.log")
    lines = []
    for path in sorted(logs, key=lambda p: p.stat().st_mtime):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("levelname") != "DEBUG":
                lines.append(f"{record.get('asctime')} {record.get('message', '')[:300]}")
    return "\n".join(lines[-40:]) or "no Ray Train controller log found"


DATA_JOB = ROOT / "tests" / "e2e" / "jobs" / "data_ids.py"  # the data tests' job: the plain `for batch in ctx.dataset("train")`

# Ray's own account (state API) of where a running job's driver and raytrain's actors are, and which nodes hold
# the blocks of its data feed (asked of the Feeder, which owns them). Formatted with the job's submission id.
PLACEMENT_PROBE = """
from ray.util.state import list_actors, list_jobs, list_nodes
nodes = {{n.node_id: n for n in list_nodes(address=gcs)}}
ip = lambda node_id: nodes[node_id].node_ip if node_id in nodes else node_id
head = next(n.node_ip for n in nodes.values() if n.is_head_node and n.state == "ALIVE")
job = next(j for j in list_jobs(address=gcs) if j.submission_id == {job_id!r})
actors = {{a.name: ip(a.node_id) for a in list_actors(address=gcs, filters=[("state", "=", "ALIVE")], limit=10000)
          if (a.name or "").startswith("raytrain-") and job.job_id in a.name}}
feeder = ray.get_actor(next(n for n in actors if n.startswith("raytrain-data-")), namespace="raytrain")
blocks = ray.get(feeder.since.remote(0, 1.0))[0]
where = ray.experimental.get_object_locations([b[0] for b in blocks])
driver = job.driver_info.node_ip_address if job.driver_info else ip(job.driver_node_id)
print(json.dumps({{"head": head, "driver": driver, "actors": actors,
                  "blocks": [sorted(ip(n) for n in where[b[0]]["node_ids"]) for b in blocks]}}))
"""


def test_an_elastic_data_job_sees_every_id_once_in_the_epoch_when_a_node_is_lost(two_nodes, request):
    """`--workers 1-2` reading `--data`: node 2 is killed after step 4's checkpoint (the job waits there for it, in
    collectives), the group continues on 1 worker from that checkpoint, and the rest of the epoch is re-split
    over the one rank: every id of the epoch exactly once (steps 1-4 of the first group, 5-12 of the second)."""
    from tests.e2e.test_data import ids_by_step, tagged

    request.addfinalizer(lambda: two_nodes.node2_alive() or two_nodes.start_node2())
    cli, shared = two_nodes.cli, two_nodes.shared_dir
    rows, steps = 48, 12  # one epoch of a global batch of 4
    data = shared / "ids.jsonl"  # both nodes read it
    data.write_text("".join(json.dumps({"id": i, "x": [0.01 * ((i * 7 + k) % 13) for k in range(8)], "y": i % 5}) + "\n"
                            for i in range(rows)))
    proc = cli("submit", DATA_JOB, "--workers", "1-2", "--placement", "spread", "--storage", shared,
               "--zero", "0", "--micro-batch", "2", "--train-batch", "4", "--checkpoint-every", "2",
               "--data", f"train={data}", "--no-wait", "--json", "--", "--steps", steps, "--pause-at-step", "4",
               check=True)
    job_id = json.loads(proc.stdout)["id"]
    request.addfinalizer(lambda: cli("jobs", "stop", job_id))
    facts = _wait_for_checkpoint(cli, job_id, 4)
    assert len({w["ip"] for w in facts.preflight["workers"]}) == 2, controller_decisions(cli)  # on both nodes
    # The driver and the data feed run on the head, whatever node 2 has free: losing node 2 costs only its worker.
    assert facts.started["driver_ip"] == two_nodes.head_ip and facts.datasets["train"]["feed_ip"] == two_nodes.head_ip
    seen = two_nodes.run_ray(PLACEMENT_PROBE.format(job_id=job_id))
    assert seen["head"] == two_nodes.head_ip and seen["driver"] == two_nodes.head_ip, seen
    assert len(seen["actors"]) == 2 and set(seen["actors"].values()) == {two_nodes.head_ip}, seen  # feed and board
    only_on_node2 = sum(locations == [two_nodes.node2_ip] for locations in seen["blocks"])
    inlined = sum(not locations for locations in seen["blocks"])  # small blocks live in their owner, the feed
    print(f"\nelastic data: {len(seen['blocks'])} block(s): {inlined} in the feed's own memory, {only_on_node2} only "
          f"on node 2 (Ray rebuilds those from their lineage when a rank needs them after the kill)")
    two_nodes.kill_node2()
    killed = time.monotonic()  # then: the node's death noticed, the group restarted on 1 worker, 8 steps
    while (state := cli.json("jobs", "status", job_id)["state"]) not in ("succeeded", "failed", "stopped"):
        assert time.monotonic() < killed + 420, f"the job is still {state} 420 s after node 2 was killed"
        time.sleep(2)
    print(f"\nelastic data: job finished {time.monotonic() - killed:.0f} s after node 2 was killed")
    log = cli("jobs", "logs", job_id, check=True).stdout
    assert state == "succeeded", log[-4000:]
    facts = cli.facts(job_id)
    assert facts.restarts >= 1 and facts.resized[-1]["workers"] == 1, facts.resized
    restored = [int(s) for s in re.findall(r"restored step (\d+) from", log)]
    assert restored and restored[-1] == 4, log[-3000:]
    events = tagged(log, "ids")
    before, after = ids_by_step(events, resumed=False), ids_by_step(events, resumed=True)
    assert sorted(after) == list(range(5, steps + 1)) and {e["rank"] for e in events if e["resumed"]} == {0}
    assert all(len(before[s]) == 4 for s in range(1, 5)) and all(len(after[s]) == 4 for s in after)
    epoch = sorted([i for s in range(1, 5) for i in before[s]] + [i for s in after for i in after[s]])
    assert epoch == list(range(rows))  # every id exactly once in the epoch
