"""`raytrain jobs logs ID`: the log as a piped `submit` showed it (the job's output, a line per step, how the
job ended), and with -v the log as it is; no Ray, a target that serves a recorded log."""
from click.testing import CliRunner

from raytrain.cli import jobs as jobs_cli
from raytrain.cli.main import main
from raytrain.events import format_event

LOG = "\n".join([
    format_event("started", name="cnn", workers=2, zero=1, precision="bf16", train_batch=8),
    "2026-12-05 04:00:00,000\tINFO job_manager.py:581 -- Runtime env is setting up.",
    "(RayTrainWorker pid=7) loading the data",
    "(RayTrainWorker pid=7) " + format_event("metrics", step=1, loss=2.5, samples_per_s=10.0, step_time_s=0.1),
    format_event("finished", metrics=None, path="/runs/x", checkpoint="/runs/x/checkpoint_000001"),
    "(RayTrainWorker pid=8) " + format_event("timing", phase="first_step", t=1.0, rank=1),
    "(RayTrainWorker pid=7) " + format_event("metrics", step=2, loss=2.0, samples_per_s=10.0, step_time_s=0.1),
    "(RayTrainWorker pid=7) the last line, after the driver's own",
]) + "\n"


class RecordedLog:
    def logs(self, job_id):
        return LOG

    def follow(self, job_id, on_text):
        on_text(LOG[:50])
        on_text(LOG[50:])


def run(monkeypatch, *args):
    monkeypatch.setattr(jobs_cli, "_target", lambda address, k8s: RecordedLog())
    out = CliRunner().invoke(main, ["jobs", "logs", "job-1", *args])
    assert out.exit_code == 0, out.output
    return out.output


def test_the_log_reads_as_submit_showed_it(monkeypatch):
    for args in ((), ("--follow",)):
        lines = run(monkeypatch, *args).splitlines()
        assert lines[0] == "raytrain: training cnn on 2 worker(s), ZeRO-1, bf16, global batch 8"
        assert "(RayTrainWorker pid=7) loading the data" in lines
        assert [line.split("  ")[0] for line in lines if line.startswith("step ")] == ["step 1", "step 2"]
        # how it ended comes last, even where workers' lines reached the log after the driver's event
        assert lines[-2:] == ["(RayTrainWorker pid=7) the last line, after the driver's own",
                              "raytrain: training finished; last checkpoint /runs/x/checkpoint_000001"]
        text = "\n".join(lines)
        assert "@@raytrain" not in text and "INFO job_manager" not in text and "\x1b" not in text


def test_verbose_is_the_log_as_it_is(monkeypatch):
    assert run(monkeypatch, "-v") == LOG


def test_a_stopped_job_ends_with_its_stop(monkeypatch):
    stopped = LOG.replace(format_event("finished", metrics=None, path="/runs/x", checkpoint="/runs/x/checkpoint_000001"),
                          format_event("stopped", signal="SIGTERM"))
    monkeypatch.setattr(RecordedLog, "logs", lambda self, job_id: stopped)
    assert run(monkeypatch).splitlines()[-1] == (
        "raytrain: stopped (SIGTERM: `raytrain jobs stop`, or its cluster stopping)")
