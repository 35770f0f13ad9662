"""A run submitted with a non-default --storage is found by `jobs logs --rank` / `jobs metrics` on the machine
that submitted it, without --storage again (the submit notes the storage under RAYTRAIN_HOME)."""
from click.testing import CliRunner

from raytrain import run_record
from raytrain.cli.main import main
from raytrain.events import format_event


def _a_run(storage, job_id):
    folder = storage / job_id / "raytrain"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "rank-0.log").write_text("rank zero says hi\n")
    (folder / "events-driver.log").write_text("1.0 " + format_event("started") + "\n"
                                             "2.0 " + format_event("metrics", step=1, loss=2.5) + "\n")
    return folder


def test_a_remembered_storage_is_found_without_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    storage = tmp_path / "elsewhere"
    folder = _a_run(storage, "raytrain-job-1")
    assert run_record.find("raytrain-job-1", [None, str(tmp_path / "home" / "runs")]) is None
    run_record.remember("raytrain-job-1", str(storage))
    assert run_record.find("raytrain-job-1", [None, str(tmp_path / "home" / "runs")]) == folder
    out = CliRunner().invoke(main, ["jobs", "logs", "raytrain-job-1", "--rank", "0"])
    assert out.exit_code == 0, out.output
    assert "rank zero says hi" in out.output
    metrics = CliRunner().invoke(main, ["jobs", "metrics", "raytrain-job-1", "--json"])
    assert metrics.exit_code == 0, metrics.output
    assert "2.5" in metrics.output


def test_what_is_not_noted(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    run_record.remember("raytrain-job-2", "s3://bucket/runs")  # a URI keeps no local record
    run_record.remember("../escape", str(tmp_path))  # not a job id: never a path outside the index
    run_record.remember("raytrain-job-3", None)
    index = tmp_path / "home" / "submitted"
    assert not index.exists() or sorted(p.name for p in index.iterdir()) == []
    assert run_record.remembered_storage("../escape") is None
    assert run_record.remembered_storage("never-submitted") is None


def test_an_explicit_storage_comes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    noted, given = _a_run(tmp_path / "noted", "run-x"), _a_run(tmp_path / "given", "run-x")
    run_record.remember("run-x", str(tmp_path / "noted"))
    assert run_record.find("run-x", [str(tmp_path / "given")]) == given
    assert run_record.find("run-x", [None]) == noted
