"""`jobs status ID` once no cluster knows the job any more (the local cluster was restarted or stopped since):
the run's record says how it ended, and where the facts come from."""
import json

import pytest
from click.testing import CliRunner

from raytrain import api, run_record
from raytrain.cli.main import main
from raytrain.errors import ClusterError
from raytrain.events import ERROR, FINISHED, MEMORY, METRICS, RESTARTING, STARTED, STOPPED, format_event
from raytrain.status import JobState
from raytrain.targets.factory import TargetOptions, make_target

T0 = 1_790_000_000.0


def a_run(storage, job_id, *last_words):
    """A run's record as the driver and rank 0 write it: started, two steps, then ``last_words``."""
    folder = storage / job_id / "raytrain"
    folder.mkdir(parents=True)
    (folder / "events-driver.log").write_text(
        f"{T0} " + format_event(STARTED, name="gpt", workers=2, zero=3, precision="bf16", train_batch=8) + "\n"
        + "".join(f"{T0 + 30 + i} " + format_event(kind, **data) + "\n" for i, (kind, data) in enumerate(last_words))
    )
    (folder / "events-rank-0.log").write_text(
        f"{T0 + 10} " + format_event(METRICS, step=1, loss=2.5) + "\n"
        + f"{T0 + 20} " + format_event(METRICS, step=2, loss=2.0) + "\n"
    )
    return folder


@pytest.mark.parametrize("last_words, state, message", [
    ([(FINISHED, {"metrics": {"loss": 2.0}})], JobState.SUCCEEDED, ""),
    ([(ERROR, {"type": "RuntimeError", "rank": 1, "message": "boom"})], JobState.FAILED, ""),
    ([(STOPPED, {"signal": "SIGTERM"})], JobState.STOPPED, "stopped (SIGTERM)"),
    ([], JobState.FAILED, "(step 2) without an outcome: its driver was killed, or its machine or cluster went down"),
])
def test_the_record_says_how_the_job_ended(tmp_path, last_words, state, message):
    folder = a_run(tmp_path, "raytrain-gpt-1", *last_words)
    info = run_record.job_info("raytrain-gpt-1", folder, why="no job 'raytrain-gpt-1' on http://127.0.0.1:8265")
    assert info.state is state
    assert message in info.message if message else info.message == ""
    assert (info.name, info.target, info.address, info.metadata) == ("gpt", "record", str(folder), {"workers": "2"})
    assert info.start_time == T0 and info.end_time == T0 + (30 if last_words else 20)
    assert info.facts.last_metrics["step"] == 2 and info.facts.losses == [2.5, 2.0]
    assert info.warnings() == [f"from the run's record in {folder} (no job 'raytrain-gpt-1' on http://127.0.0.1:8265)"]


def test_status_falls_back_to_the_record_only_where_the_cluster_does_not_know_the_job(raytrain_home):
    target = make_target(TargetOptions(), auto_start=False)  # no local cluster runs here
    with pytest.raises(ClusterError, match="not running"):
        api.status("raytrain-gpt-1", target)  # and no record either: the cluster's error stands
    a_run(raytrain_home / "runs", "raytrain-gpt-1", (STOPPED, {"signal": "SIGTERM"}))
    info = api.status("raytrain-gpt-1", target)
    assert info.state is JobState.STOPPED and "not running" in info.warnings()[0]


def test_jobs_status_shows_a_job_of_a_cluster_that_is_gone(raytrain_home):
    folder = a_run(raytrain_home / "runs", "raytrain-gpt-1", (FINISHED, {"metrics": {"loss": 2.0}}))
    out = CliRunner().invoke(main, ["jobs", "status", "raytrain-gpt-1"])
    assert out.exit_code == 0, out.output
    assert "state     succeeded" in out.output and "step 2" in out.output and "loss 2.0000" in out.output
    assert f"warning   from the run's record in {folder} (the local Ray cluster is not running" in out.output
    as_json = json.loads(CliRunner().invoke(main, ["jobs", "status", "raytrain-gpt-1", "--json"]).output)
    assert as_json["state"] == "succeeded" and as_json["target"] == "record" and as_json["final"] is not None
    missing = CliRunner().invoke(main, ["jobs", "status", "raytrain-gpt-2"])
    assert missing.exit_code == 2 and "not running" in missing.output


def test_jobs_list_shows_the_runs_recorded_here_while_the_local_cluster_is_stopped(raytrain_home):
    runs = raytrain_home / "runs"
    a_run(runs, "raytrain-gpt-1", (FINISHED, {"metrics": {"loss": 2.0}}))
    newer = a_run(runs, "raytrain-gpt-2", (STOPPED, {"signal": "SIGTERM"}))
    for path in newer.glob("events-*.log"):  # started an hour later
        path.write_text("".join(f"{float(line.split(' ', 1)[0]) + 3600} {line.split(' ', 1)[1]}\n"
                                for line in path.read_text().splitlines()))
    (runs / "not-a-run").mkdir()  # a folder without a record, and a run without the driver's events: left out
    (runs / "raytrain-gpt-3" / "raytrain").mkdir(parents=True)
    (runs / "raytrain-gpt-3" / "raytrain" / "events-rank-0.log").write_text(f"{T0} " + format_event(METRICS, step=1) + "\n")
    infos = api.jobs(make_target(TargetOptions(), auto_start=False))
    assert [(i.job_id, i.state, i.target) for i in infos] == [
        ("raytrain-gpt-2", JobState.STOPPED, "record"), ("raytrain-gpt-1", JobState.SUCCEEDED, "record")]
    assert infos[1].facts.metrics == []  # a list reads the driver's events only: a long run's steps are not read
    out = CliRunner().invoke(main, ["jobs", "list"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert [line.split()[:4] for line in lines] == [["id", "name", "state", "workers"],
                                                   ["raytrain-gpt-2", "gpt", "stopped", "2"],
                                                   ["raytrain-gpt-1", "gpt", "succeeded", "2"]]
    newest = CliRunner().invoke(main, ["jobs", "list", "--last", "1", "--json"])
    assert newest.exit_code == 0 and [j["id"] for j in json.loads(newest.output)] == ["raytrain-gpt-2"]
    assert CliRunner().invoke(main, ["jobs", "list", "--last", "0"]).exit_code == 2


def test_jobs_logs_of_a_job_no_cluster_knows_shows_its_recorded_events(raytrain_home):
    folder = a_run(raytrain_home / "runs", "raytrain-gpt-1", (FINISHED, {"metrics": {"loss": 2.0}}))
    out = CliRunner().invoke(main, ["jobs", "logs", "raytrain-gpt-1"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0] == "raytrain: training gpt on 2 worker(s), ZeRO-3, bf16, global batch 8"
    assert [line.split("  ")[0] for line in lines if line.startswith("step ")] == ["step 1", "step 2"]
    assert lines[-1] == "raytrain: training finished"
    assert f"raytrain: the run's record in {folder} (the local Ray cluster is not running" in out.stderr
    assert "--rank N" in out.stderr
    raw = CliRunner().invoke(main, ["jobs", "logs", "raytrain-gpt-1", "-v"])
    assert raw.exit_code == 0 and raw.stdout.count("@@raytrain ") == 4, raw.stdout
    missing = CliRunner().invoke(main, ["jobs", "logs", "raytrain-gpt-2"])
    assert missing.exit_code == 2 and "not running" in missing.output


def test_ray_trains_controller_records_its_events_from_the_jobs_environment(tmp_path, monkeypatch):
    """The controller is handed no plan: it finds the run's record from the job's environment, so the
    preflight, its timings and restarts are in the record (`jobs status` shows them once the cluster is gone)."""
    from raytrain import events

    monkeypatch.setattr(events, "_record", None)
    monkeypatch.delenv("RAYTRAIN_PLAN", raising=False)
    assert run_record.start_from_env("controller") is None and events.recording() is None
    monkeypatch.setenv("RAYTRAIN_PLAN", json.dumps({"name": "gpt", "storage": str(tmp_path)}))
    monkeypatch.setenv("RAYTRAIN_RUN_NAME", "raytrain-gpt-1")
    path = run_record.start_from_env("controller")
    assert path == str(tmp_path / "raytrain-gpt-1" / "raytrain" / "events-controller.log")
    assert run_record.start_from_env("controller") == path  # once per process (each worker-group start asks)
    events.emit(events.PREFLIGHT, workers=[{"rank": 0}])
    facts = events.JobFacts.from_lines(run_record.read_lines(tmp_path / "raytrain-gpt-1" / "raytrain"))
    assert facts.preflight == {"event": "preflight", "workers": [{"rank": 0}]}
    monkeypatch.setattr(events, "_record", None)
    monkeypatch.setenv("RAYTRAIN_PLAN", json.dumps({"name": "gpt", "storage": "s3://bucket/runs"}))
    assert run_record.start_from_env("controller") is None  # a URI keeps no record


def test_an_ended_jobs_steps_its_log_missed_come_from_its_record(tmp_path):
    """Ray streams a worker's output into the job's log asynchronously: a job that ends right after its last
    report can end before those lines arrive. Its record has them."""
    from raytrain.events import JobFacts
    from raytrain.status import JobInfo

    a_run(tmp_path, "raytrain-gpt-1", (FINISHED, {"metrics": {}}))
    log_facts = JobFacts.from_lines([format_event(STARTED, name="gpt", workers=2), format_event(FINISHED)])

    def info(state, facts):
        return JobInfo(job_id="raytrain-gpt-1", name="gpt", state=state, target="local", address="", facts=facts)

    done = api.with_recorded_steps(info(JobState.SUCCEEDED, log_facts), str(tmp_path))
    assert done.facts.last_metrics["step"] == 2 and done.facts.losses == [2.5, 2.0]
    running = api.with_recorded_steps(info(JobState.RUNNING, log_facts), str(tmp_path))
    assert running.facts.last_metrics is None  # a running job's log is still arriving: as it is
    ahead = JobFacts.from_lines([format_event(METRICS, step=3, loss=1.0), format_event(FINISHED)])
    assert api.with_recorded_steps(info(JobState.SUCCEEDED, ahead), str(tmp_path)).facts is ahead


def test_an_ended_job_whose_log_has_the_records_last_step_is_not_read_from_the_record(tmp_path, monkeypatch):
    """A long run's record holds millions of lines: `jobs status` reads it whole only where the log lacks the
    record's last step (found from the end of rank 0's file)."""
    from raytrain.events import JobFacts
    from raytrain.status import JobInfo

    folder = a_run(tmp_path, "raytrain-gpt-1", (FINISHED, {"metrics": {}}))
    with open(folder / "events-rank-0.log", "a") as f:  # later lines of other kinds, and a line cut short
        f.write(f"{T0 + 25} " + format_event(MEMORY, rank=0, rss_peak=1) + "\n" + f"{T0 + 26} @@raytrain {{\"ev")
    assert run_record.last_step(folder) == 2
    assert run_record.last_step(folder, tail_bytes=40) is None  # not in the tail read: unknown
    assert run_record.last_step(tmp_path / "no-record") is None
    reads = []
    real = run_record.read_lines
    monkeypatch.setattr(run_record, "read_lines", lambda f: reads.append(f) or real(f))

    def status(*steps):
        facts = JobFacts.from_lines([format_event(METRICS, step=s, loss=1.0) for s in steps] + [format_event(FINISHED)])
        info = JobInfo(job_id="raytrain-gpt-1", name="gpt", state=JobState.SUCCEEDED, target="local", address="",
                       facts=facts)
        return facts, api.with_recorded_steps(info, str(tmp_path)).facts

    facts, shown = status(1, 2)
    assert shown is facts and reads == []  # the log is whole: the record is not read
    facts, shown = status(1)
    assert shown is not facts and shown.last_metrics["step"] == 2 and len(reads) == 1  # behind: the record's
    monkeypatch.setattr(run_record, "last_step", lambda folder: None)  # the tail had no step: read it to know
    facts, shown = status(1, 2)
    assert shown is facts and len(reads) == 2


def test_a_line_copied_into_the_log_twice_counts_once_and_distinct_events_all_count():
    from raytrain.events import JobFacts

    restart = format_event(RESTARTING, time=T0, attempt=1)
    facts = JobFacts.from_lines([restart, f"(RayTrainWorker pid=7) {restart}", format_event(RESTARTING, time=T0 + 1),
                                 format_event(METRICS, step=1, loss=2.0) + format_event(METRICS, step=2, loss=1.0)])
    assert facts.restarts == 2 and [m["step"] for m in facts.metrics] == [1, 2]
    facts.add({"event": RESTARTING, "time": T0 + 2})  # an event handed over as a dict is told by its content
    facts.add({"time": T0 + 2, "event": RESTARTING})
    assert facts.restarts == 3
