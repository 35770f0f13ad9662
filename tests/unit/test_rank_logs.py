"""Per-rank logs kept in the run's storage (issue 17): `jobs logs ID --rank N | --node`, after the cluster is
gone; a failure names the rank and shows its last lines."""
import sys

from click.testing import CliRunner

from raytrain import run_record
from raytrain.api import failing_rank_tail
from raytrain.cli.main import main
from raytrain.events import JobFacts, format_event
from raytrain.runtime import rank_log
from raytrain.status import JobInfo, JobState


def record_rank(folder, rank, ip, lines):
    saved = sys.stdout, sys.stderr
    try:
        rank_log.start(folder, rank, ip)
        for line in lines:
            print(line)
        sys.stdout.write(format_event("metrics", step=1) + "\n")
        print("a traceback line", file=sys.stderr)
    finally:
        sys.stdout.copy.close()
        sys.stdout, sys.stderr = saved


def test_rank_logs_by_rank_and_node_without_a_cluster(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    folder = tmp_path / "runs" / "run-1" / "raytrain"
    record_rank(folder, 0, "10.0.0.1", ["rank zero says hi"])
    record_rank(folder, 1, "10.0.0.2", ["rank one says hi"])
    record_rank(folder, 1, "10.0.0.3", ["rank one again, after a restart"])
    assert "rank zero says hi" in capsys.readouterr().out  # Ray still gets everything
    (folder / "events-driver.log").write_text("1.0 " + format_event("started") + "\n")
    runner = CliRunner()
    base = ["jobs", "logs", "run-1", "--storage", str(tmp_path / "runs")]
    out = runner.invoke(main, [*base, "--rank", "1"])
    assert out.exit_code == 0, out.output
    assert "rank one says hi" in out.output and "after a restart" in out.output and "rank zero" not in out.output
    assert "a traceback line" in out.output and "@@raytrain" not in out.output
    assert "@@raytrain" in runner.invoke(main, [*base, "--rank", "1", "-v"]).output
    by_node = runner.invoke(main, [*base, "--node", "10.0.0.1"]).output
    assert "rank zero says hi" in by_node and "rank one" not in by_node
    both = runner.invoke(main, [*base, "--rank", "0", "--rank", "1"]).output
    assert "(rank 0) rank zero says hi" in both and "(rank 1) rank one says hi" in both
    missing = runner.invoke(main, [*base, "--rank", "7"])
    assert missing.exit_code == 2 and "no rank(s) 7; the run has rank(s) 0, 1" in missing.output


def test_a_failure_shows_the_failing_ranks_last_lines(tmp_path):
    folder = tmp_path / "run-1" / "raytrain"
    record_rank(folder, 1, "10.0.0.2", [f"line {i}" for i in range(30)] + ["ValueError: bad shard"])
    facts = JobFacts(error={"event": "error", "rank": 1, "type": "ValueError", "message": "bad shard"})
    info = JobInfo(job_id="run-1", name="x", state=JobState.FAILED, target="local", address="", facts=facts)
    text = failing_rank_tail(info, str(tmp_path))
    assert "last lines of rank 1 (all: raytrain jobs logs run-1 --rank 1):" in text
    assert "  ValueError: bad shard" in text and "line 29" in text and "line 10" not in text
    assert failing_rank_tail(info, None) == ""
