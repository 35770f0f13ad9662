"""`raytrain submit` end to end: real local Ray cluster, real DeepSpeed engines on 2 CPU workers (gloo)."""
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from raytrain.ray_tuning import off_reason
from tests.conftest import JOBS

pytestmark = pytest.mark.e2e
# the suite's cluster and jobs run with raytrain's Ray tunings unless RAYTRAIN_RAY_TUNING=off or the installed
# Ray is one they were not written for (docs/ray-tuning.md); what only a tuning does is checked only where it runs
TUNED = off_reason("light_setup_worker") is None

JOB_ID = re.compile(r"raytrain-[A-Za-z0-9._-]+-\d{8}-\d{6}-[0-9a-f]{6}")


def job_id_of(output: str) -> str:
    match = JOB_ID.search(output)
    assert match, output
    return match.group(0)


def assert_loss_falls(losses, steps):
    assert len(losses) == steps, losses
    assert sum(losses[-3:]) / 3 < losses[0] - 0.05, losses


def live_actor_classes(cli) -> list[str]:
    """The classes of the local cluster's actors that are not dead (Ray's state API, as `jobs stop` reads it)."""
    code = ("import json; from raytrain.targets.factory import make_target; d = make_target(auto_start=False).dashboard;"
            "print(json.dumps(sorted(a.get('class_name') for a in d._state('actors', '&detail=1')"
            " if str(a.get('state', '')).upper() != 'DEAD')))")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], env=cli.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.smoke
@pytest.mark.cold_start
def test_submit_cnn_starts_the_local_cluster_and_trains(e2e_env):
    cli = e2e_env
    cli("cluster", "down", "--force", check=True, timeout=120)  # whatever ran before: submit must start it
    assert "no local Ray cluster" in cli("cluster", "status").stdout
    proc = cli("submit", JOBS / "cnn.py", "--workers", "2", "--zero", "1", "--precision", "bf16",
               "--grad-accum", "2", "--micro-batch", "16", "--", "--steps", "12")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "training cnn on 2 worker(s), ZeRO-1, bf16, global batch 64" in out
    assert "succeeded" in out
    # the CPU workers run with Ray's jemalloc in place of glibc's malloc (raytrain.ray_tuning.ray_setup_worker)
    assert "2 worker(s) on 1 node(s)" in out and ("; malloc: jemalloc" in out or not TUNED), out
    # the wait for the cluster's start is said, once, before the job is submitted
    assert out.count("raytrain: starting the local Ray cluster") == 1, out
    assert proc.stdout.index("starting the local Ray cluster") < proc.stdout.index("raytrain: submitted"), out
    # stdout piped, as a fresh quick start into a file: no ANSI escape, no Ray INFO line, no Ray internals
    assert "\x1b" not in out, out
    assert not re.search(r"^\d{4}-\d\d-\d\d [\d:,]+\s+INFO ", out, re.M), out
    assert "Running entrypoint" not in out and "core_worker.cc" not in out, out
    job = job_id_of(out)
    assert_loss_falls(cli.facts(job).losses, 12)

    # no actor of the job outlived it: Ray Train's AutoscalingCoordinator, which a fixed-size run would create
    # on a fresh cluster and leave there for good, was never made (no autoscaler on the local cluster)
    if TUNED:  # lean_trainer; stock Ray Train keeps its coordinator actor
        assert live_actor_classes(cli) == [], live_actor_classes(cli)

    # the cluster it started stays up, with its resources and token auth, for the next command
    status = cli.json("cluster", "status")
    # as many CPUs as Ray sees for this machine (cgroup quota and affinity included), never os.cpu_count()
    from ray._private.utils import get_num_cpus

    assert status["running"] and status["totals"]["cpus"] == get_num_cpus()
    assert status["totals"]["cpus"] <= len(os.sched_getaffinity(0))
    assert status["dashboard"].startswith("http://127.0.0.1:")

    listed = cli.json("jobs", "list")
    mine = [j for j in listed if j["id"] == job]
    assert len(mine) == 1 and mine[0]["state"] == "succeeded" and mine[0]["name"] == "cnn"  # its record not twice
    assert mine[0]["target"] == "local"
    assert "succeeded" in cli("jobs", "list").stdout

    info = cli.json("jobs", "status", job)
    assert info["state"] == "succeeded" and info["last_metrics"]["step"] == 12
    assert info["final"] is not None
    text = cli("jobs", "status", job, check=True).stdout
    assert "state     succeeded" in text and "step 12" in text

    # where the time went, from the command's start to step 1, every phase in order (issue 18)
    rows = cli.json("jobs", "status", job, "--timings")["timings"]
    phases = [r["phase"] for r in rows]
    expected = ["command", "request_built", "submitted", "job_accepted", "driver_started", "prestart",
                "driver_ready", "workers_started", "preflight", "process_group", "worker_process", "early_imports",
                "train_fn", "imports", "engine_built", "first_step"]
    if not TUNED:  # no processes started ahead, no background imports
        expected = [p for p in expected if p not in ("prestart", "early_imports")]
    assert phases == expected, phases
    by = {r["phase"]: r for r in rows}
    assert by["command"]["at_s"] == 0 and 0 < by["first_step"]["at_s"] < 600
    assert by["imports"]["ranks"] == 2 and by["first_step"]["ranks"] == 2
    assert by["worker_process"]["ranks"] == 2
    if TUNED:
        # torch and deepspeed were imported in the background from each worker's start, before the train function
        assert by["early_imports"]["ranks"] == 2 and by["early_imports"]["t"] <= by["imports"]["t"]
        # both workers run in processes the driver had the node start ahead (raytrain.ray_tuning.prestart): they
        # existed before the driver built its trainer, i.e. before Ray Train could have asked for them
        assert by["worker_process"]["t"] < by["driver_ready"]["t"], by
    table = cli("jobs", "status", job, "--timings", check=True).stdout
    assert "engine_built" in table and "DeepSpeed engine built" in table

    # the two 1-CPU workers fill a 2-core node: each trains on a core of its own (raytrain.runtime.worker.core_binding);
    # on a bigger machine the node has cores to spare and nobody is bound
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) == 2:
        assert by["imports"]["cores"] == {"0": [allowed[0]], "1": [allowed[1]]}, by["imports"]
        assert f"training threads on cores {allowed[0]} | {allowed[1]}" in table, table
    else:
        assert by["imports"]["cores"] is None, by["imports"]


def test_submit_gpt_zero3_bf16_grad_accum(cli):
    proc = cli("submit", JOBS / "gpt_zero.py", "--workers", "2", "--zero", "3", "--precision", "bf16",
               "--grad-accum", "4", "--micro-batch", "2", "--json", "--", "--steps", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["state"] == "succeeded" and info["metadata"]["zero"] == "3"
    assert_loss_falls(cli.facts(info["id"]).losses, 10)
    # every worker reported its peak memory (RSS on CPU workers); rank 0 the planner's estimate
    assert set(info["memory"]) == {"0", "1"}
    assert all(m["source"] == "cpu" and m["rss_peak"] > 100e6 for m in info["memory"].values())
    import sys
    sys.path.insert(0, str(JOBS))
    try:
        import gpt_zero
    finally:
        sys.path.remove(str(JOBS))
    assert info["estimate"]["params"] == sum(p.numel() for p in gpt_zero.model([]).parameters())
    assert "peak RSS (CPU workers): rank 0" in proc.stderr and "planner estimate per worker" in proc.stderr


def test_more_workers_than_the_cluster_has_fails_fast(cli):
    cpus = int(cli.json("cluster", "status")["totals"]["cpus"])
    before = {j["id"] for j in cli.json("jobs", "list")}
    proc = cli("submit", JOBS / "cnn.py", "--workers", str(4 * cpus))
    assert proc.returncode == 2
    assert f"--workers {4 * cpus} x (1 CPU) needs {4 * cpus} CPU; the cluster has {cpus} CPU and 0 GPU" in proc.stderr
    assert f"use --workers {cpus} or fewer" in proc.stderr
    # fast: refused before anything was sent to the cluster (no job, not a job that failed later)
    assert "raytrain: submitted" not in proc.stdout + proc.stderr
    assert {j["id"] for j in cli.json("jobs", "list")} == before


def test_gpus_on_a_cpu_cluster_fail_fast(cli):
    proc = cli("submit", JOBS / "cnn.py", "--gpus-per-worker", "1")
    assert proc.returncode == 2 and "the cluster has no GPU: use --gpus-per-worker 0" in proc.stderr


def test_a_failing_job_exits_1_with_its_error(cli, tmp_path):
    job = tmp_path / "broken.py"
    job.write_text("def load(path):\n    raise ValueError(f'the data path {path} does not exist')\n\n"
                   "def train(ctx):\n    print('loading', flush=True)\n    load('/nope')\n")
    proc = cli("submit", job, "--workers", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ValueError: the data path /nope does not exist" in proc.stderr
    # the traceback once, from the job's own frames: not Ray Train's copy, not the driver's, not the summary's
    out = proc.stdout + proc.stderr
    assert out.count("Traceback (most recent call last)") == 1, out
    assert re.search(r'broken\.py", line 6, in train\n.*\n.*broken\.py", line 2, in load', out), out
    for noise in ("Error in training function", "WorkerGroupError", "raytrain/runtime/"):
        assert noise not in out, out
    # where the rank's output is: above (the follow showed it), or the traceback the worker sent where its log
    # has not reached the storage yet, or the log's last lines where Ray's stream of it ended early
    assert re.search(r"\(its output is above; all of rank 0's: raytrain jobs logs \S+ --rank 0\)"
                     r"|rank 0's traceback \(all of its output, once its log has reached the storage: "
                     r"|last lines of rank 0 \(all: ", proc.stderr), out
    info = cli.json("jobs", "status", job_id_of(proc.stdout + proc.stderr))
    assert info["state"] == "failed" and info["error"]["type"] == "ValueError"


# The job stops its rank's log copier (raytrain.runtime.worker.rank_log_copy, found by the worker's pid in its file's
# name) before it fails, and says which process it stopped; the test lets it go on once submit has answered.
BEHIND = """import os, signal, time
from pathlib import Path

def load(path):
    raise ValueError(f'the data path {path} does not exist')

def train(ctx):
    pid = copier_of_this_worker()
    os.kill(pid, signal.SIGSTOP)
    Path(ctx.args[0]).write_text(str(pid))
    load('/nope')

def copier_of_this_worker():
    mine = f"-rank-0-{os.getpid()}-".encode()
    deadline = time.monotonic() + 60  # it is started before train(ctx); a loaded machine may be slow to show it
    while time.monotonic() < deadline:
        for argv in copiers():
            if any(mine in a for a in argv):
                return int(argv[0])
        time.sleep(0.2)
    raise RuntimeError(f"no rank log copier for this worker ({mine}) among {copiers()}")

def copiers():
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        except OSError:
            continue
        if any(a.endswith(b"rank_log_copy.py") for a in argv) and forked(pid):
            out.append([pid.encode(), *argv])
    return out

def forked(pid):
    # the copier proper: not the process the worker started (a session leader, which forks it and exits)
    try:
        state, _ppid, _pgrp, session = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:4]
    except (OSError, ValueError):
        return False
    return state != "Z" and session != pid
"""


def test_a_failure_shows_the_ranks_traceback_while_its_log_copier_is_behind(cli, tmp_path):
    """A rank's log reaches the storage through a copier of its own, which may be behind when the job fails:
    here it is stopped before the error, so none of the error is in the storage when submit reports it. The
    summary still has the traceback (the worker sent it with its failure). `-q`: no followed output shows it."""
    job, stopped = tmp_path / "behind.py", tmp_path / "copier.pid"
    job.write_text(BEHIND)
    try:
        proc = cli("submit", job, "--workers", "1", "-q", "--", stopped)
    finally:
        if stopped.exists():
            os.kill(int(stopped.read_text()), signal.SIGCONT)
    out = proc.stdout + proc.stderr
    assert stopped.exists(), out  # the copier was stopped before the error
    assert proc.returncode == 1, out
    assert "ValueError: the data path /nope does not exist" in proc.stderr
    assert re.search(r"rank 0's traceback \(all of its output, once its log has reached the storage: "
                     r"raytrain jobs logs \S+ --rank 0\):\n", proc.stderr), out
    assert out.count("Traceback (most recent call last)") == 1, out
    assert re.search(r'behind\.py", line 11, in train\n.*\n.*behind\.py", line 5, in load', out), out
    # let go, the copier makes its final copy: the rank's log has the error too
    job_id = job_id_of(out)
    deadline = time.monotonic() + 60
    while "ValueError: the data path /nope" not in (logs := cli("jobs", "logs", job_id, "--rank", "0")).stdout:
        assert time.monotonic() < deadline, (
            "the copier did not copy the rank's log within 60 s of going on: " + _copier_state(cli, job_id, stopped)
            + f"; `jobs logs --rank 0` exited {logs.returncode}: {logs.stdout[-600:]!r} {logs.stderr[-600:]!r}")
        time.sleep(1)


def _copier_state(cli, job_id, pid_file):
    """What a failure of the copier test says (seen once in CI, 2026-12-07, under -n 2): the copier's process
    state, and the ends of the rank's local log and of its copy in the storage."""
    import tempfile

    pid = pid_file.read_text().strip()
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:4]
    except OSError as exc:
        state = f"gone ({exc.strerror})"
    local = sorted((Path(tempfile.gettempdir()) / f"raytrain-{os.getuid()}" / "rank-logs").glob(f"{job_id}-rank-0-*"))
    copy = Path(cli.env["RAYTRAIN_HOME"]) / "runs" / job_id / "raytrain" / "logs" / "rank-0.log"
    tails = {str(p): p.read_text(errors="replace")[-600:] for p in [*local, copy] if p.exists()}
    return f"copier {pid}: {state}; files: {tails}"


SLEEPY = Path(__file__).parent / "jobs" / "sleepy.py"


def _sleepy(cli, *args, seconds="600"):
    proc = cli("submit", SLEEPY, "--workers", "2", "--no-wait", "--json", *args, "--", seconds, check=True)
    return json.loads(proc.stdout)["id"]


def _until(what, probe, timeout=300):
    """Poll ``probe()`` until it returns something truthy (an observable state, not a sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s")


def _placed(cli, job):
    return '"event":"placed"' in cli("jobs", "logs", job, "-v", check=True).stdout


def test_stop_during_worker_start_then_a_waiting_job_names_its_holder_and_gives_up(cli, request):
    """Stopping a job while its workers start frees them (Ray 2.60 can leak the placement group: `jobs stop`
    waits for it and removes it); a job that waits behind another is pending, names the holder, and gives up
    after --start-timeout; once the holder is stopped a 2-worker job runs to the end."""
    starting = _sleepy(cli)
    _until("the first job's workers are placed", lambda: _placed(cli, starting))
    stopped = cli("jobs", "stop", starting)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"{starting}: stopped; its workers and placement groups are gone" in stopped.stdout

    holder = _sleepy(cli)
    # a failure below must not leave the holder's 2 CPU held: every later test would wait behind it
    request.addfinalizer(lambda: cli("jobs", "stop", holder, timeout=120))
    _until("the holder's workers are placed", lambda: _placed(cli, holder))
    waiter = _sleepy(cli, "--start-timeout", "30", seconds="1")
    shown = _until("the second job is pending, saying what it waits for",
                   lambda: (lambda out: out if "waiting " in out else None)(
                       cli("jobs", "status", waiter, check=True).stdout))
    assert "state     pending" in shown and f"waiting   2 CPU; 2 CPU held by job {holder}" in shown, shown
    info = _until("the waiting job gives up", lambda: (lambda i: i if i["state"] != "pending" else None)(
        cli.json("jobs", "status", waiter)), timeout=180)
    assert info["state"] == "failed" and info["error"]["type"] == "StartTimeout", info
    assert f"within 30 s (--start-timeout): waiting for 2 CPU; 2 CPU held by job {holder}" in info["error"]["message"]

    down = cli("cluster", "down")  # no terminal to ask on: refused while the holder runs
    assert down.returncode == 2 and holder in down.stdout and "give --force" in down.stderr, down.stdout + down.stderr
    assert "stopped; its workers and placement groups are gone" in cli("jobs", "stop", holder, check=True).stdout
    proc = cli("submit", SLEEPY, "--workers", "2", "--", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cli.json("jobs", "status", holder)["state"] == "stopped"


def test_secrets_in_the_job_folder_are_never_shipped(cli, tmp_path):
    (tmp_path / ".env").write_text("API_KEY=secret\n")
    (tmp_path / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (tmp_path / "helper.py").write_text("VALUE = 41\n")
    (tmp_path / "job.py").write_text(
        "import os\n"
        "from helper import VALUE\n"
        "def train(ctx):\n"
        "    here = os.path.dirname(os.path.abspath(__file__))\n"
        "    shipped = sorted(os.listdir(here))\n"
        "    assert '.env' not in shipped and 'deploy.pem' not in shipped, shipped\n"
        # the local cluster runs a copy of the folder made at submit, never the folder itself
        f"    assert here != {str(tmp_path)!r} and os.path.basename(os.path.dirname(here)) == 'job-code', here\n"
        "    ctx.report({'loss': float(VALUE + 1), 'step': 1})\n"
    )
    proc = cli("submit", tmp_path / "job.py", "--workers", "1", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["last_metrics"]["loss"] == 42.0  # sibling module shipped and imported
    assert not (Path(cli.env["RAYTRAIN_HOME"]) / "job-code" / out["id"]).exists()  # the driver removed its copy


def test_gpus_on_a_cpu_cluster(cli):
    proc = cli("gpus", check=True)
    assert proc.stdout.startswith("no GPU on the cluster at http://127.0.0.1:") and "1 node(s)" in proc.stdout
    nodes = cli.json("gpus")["nodes"]
    assert len(nodes) == 1 and nodes[0]["gpus"] == [] and nodes[0]["hostname"]


def test_logs_follow_of_a_finished_job_ends(cli):
    done = [j["id"] for j in cli.json("jobs", "list") if j["state"] == "succeeded" and j.get("name") == "cnn"]
    job = done[0] if done else job_id_of(cli("submit", JOBS / "cnn.py", "--", "--steps", "2", check=True).stdout)
    proc = cli("jobs", "logs", job, "--follow", timeout=60)
    assert proc.returncode == 0 and "@@raytrain" not in proc.stdout, proc.stdout  # as submit showed it
    assert re.search(r"^step \d+", proc.stdout, re.M) and "raytrain: training finished" in proc.stdout, proc.stdout
    raw = cli("jobs", "logs", job, "--follow", "-v", timeout=60)
    assert raw.returncode == 0 and '"event":"finished"' in raw.stdout
    assert cli("jobs", "status", "raytrain-no-such-job").returncode == 2


def test_every_line_the_ranks_print_as_training_ends_is_in_the_jobs_log(cli, tmp_path):
    """Ray forwards the workers' lines into the job's log asynchronously: before the driver waited for them
    (runtime.driver.log_drain), 40,000 of these 100,000 lines were missing."""
    (tmp_path / "job.py").write_text(
        "import sys\n"
        "def train(ctx):\n"
        "    ctx.report({'loss': 1.0, 'step': 1})\n"
        "    sys.stdout.write(''.join(f'tail {ctx.rank} {i}\\n' for i in range(50000)))\n"
        "    print(f'last line of rank {ctx.rank}', flush=True)\n"
    )
    proc = cli("submit", tmp_path / "job.py", "--workers", "2", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = json.loads(proc.stdout)["id"]
    logs = cli("jobs", "logs", job, timeout=120)
    assert logs.returncode == 0, logs.stderr[-2000:]
    for rank in (0, 1):
        got = re.findall(rf"^\(RayTrainWorker pid=\d+\) tail {rank} (\d+)$", logs.stdout, re.M)
        assert [int(i) for i in got] == list(range(50000)), (rank, len(got))
        assert f"last line of rank {rank}" in logs.stdout
    assert "did not reach the job's log" not in logs.stdout + logs.stderr


@pytest.mark.stops_cluster
def test_a_job_of_a_cluster_that_is_gone_is_read_from_its_record(cli):
    """After `cluster down` (or a restart) the cluster knows no earlier job: `jobs status` reads the run's record
    instead and says so. Marked ``stops_cluster``: run last among the e2e tests (saves a restart); anywhere
    else the next test's ``cli`` fixture starts the cluster again."""
    done = [j["id"] for j in cli.json("jobs", "list") if j["state"] == "succeeded" and j.get("name") == "cnn"]
    job = done[0] if done else job_id_of(cli("submit", JOBS / "cnn.py", "--", "--steps", "2", check=True).stdout)
    steps = cli.json("jobs", "status", job)["last_metrics"]["step"]
    cli("cluster", "down", "--force", check=True, timeout=120)
    text = cli("jobs", "status", job, check=True).stdout
    assert "state     succeeded" in text and f"step {steps}" in text, text
    assert "from the run's record in " in text and "the local Ray cluster is not running" in text, text
    # where its workers ran: Ray Train's controller recorded the preflight too
    assert re.search(r"^workers\s+preflight ok .*\d+ worker\(s\) on 1 node\(s\)", text, re.M), text
    info = cli.json("jobs", "status", job)
    assert (info["state"], info["target"], info["last_metrics"]["step"]) == ("succeeded", "record", steps), info
    # `jobs list` shows it (and every run recorded here) while the cluster is stopped; `jobs logs` its events
    listed = {j["id"]: j for j in cli.json("jobs", "list")}
    assert (listed[job]["state"], listed[job]["target"]) == ("succeeded", "record"), listed
    logs = cli("jobs", "logs", job, check=True)
    last = logs.stdout.rstrip().splitlines()[-1]  # "; last checkpoint PATH" follows where the job saved one
    assert last.startswith("raytrain: training finished") and f"step {steps}" in logs.stdout, logs.stdout
    assert "the run's record in " in logs.stderr, logs.stderr
    assert cli("jobs", "status", "raytrain-no-such-job").returncode == 2


def test_jobs_reads_answer_without_rays_job_client(cli):
    """`jobs list|status|logs [--follow]` (and `submit`'s follow) use the Jobs REST API directly: Ray's client
    (and Ray with it) is half a second of CPU on every command."""
    import subprocess
    import sys

    jobs = cli.json("jobs", "list")
    assert jobs, "the suite's earlier tests ran jobs on this cluster"
    job = jobs[0]["id"]
    for args in (["jobs", "list", "--json"], ["jobs", "status", job, "--json"], ["jobs", "logs", job],
                 ["jobs", "logs", job, "--follow"]):  # an ended job: its log in one piece
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "raytrain.cli.main", *args], env=cli.env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert "ray.job_submission" not in imported and "ray" not in imported, args
