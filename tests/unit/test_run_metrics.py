"""`jobs metrics|plot|compare` (issue 17): a run's record in storage -> a table, CSV, JSON and pictures,
with no cluster at all."""
import json

import pytest
from click.testing import CliRunner

from raytrain import events, run_record
from raytrain.cli.main import main
from raytrain.run_metrics import from_lines


def write_run(storage, run, *, steps=6, restart_at=None, gpu=False, loss0=5.0):
    """Record a run as the driver and two workers would (events.emit with run_record.start)."""
    try:
        run_record.start(str(storage), run, "driver")
        events.emit(events.STARTED, name="gpt", workers=2)
        run_record.start(str(storage), run, "rank-0")
        events.emit(events.ESTIMATE, params=1000, model_states=5e8, gpu_total=1.5e9, gpu_allocated=1e9,
                    cpu_per_node=1)
        attempts = [range(1, steps + 1)] if restart_at is None else [range(1, restart_at + 1), range(restart_at - 1, steps + 1)]
        for attempt, rng in enumerate(attempts):
            if attempt:
                run_record.start(str(storage), run, "driver")
                events.emit(events.RESTARTING, attempt=2, rank=1, reason="killed")
            for step in rng:
                run_record.start(str(storage), run, "rank-0")
                events.emit(events.METRICS, step=step, loss=loss0 - 0.1 * step, samples_per_s=10.0 + step)
                for rank in (0, 1):
                    run_record.start(str(storage), run, f"rank-{rank}")
                    peak = (6e8 + 1e7 * step + rank * 1e6)
                    events.emit(events.MEMORY, rank=rank, source="gpu" if gpu else "cpu",
                                rss_peak=peak, gpu_memory_peak=peak if gpu else None)
        run_record.start(str(storage), run, "driver")
        events.emit(events.FINISHED, metrics={})
    finally:
        events.record_to(None)


def test_the_record_gives_one_row_per_step_with_every_ranks_memory(tmp_path, capsys):
    write_run(tmp_path, "run-a", steps=6, restart_at=4)
    capsys.readouterr()
    folder = run_record.find("run-a", [None, str(tmp_path)])
    assert folder == tmp_path / "run-a" / "raytrain"
    assert sorted(p.name for p in folder.iterdir()) == ["events-driver.log", "events-rank-0.log", "events-rank-1.log"]
    run = from_lines("run-a", run_record.read_lines(folder))
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4, 5, 6]  # steps 3, 4 repeated after the restart: once each
    assert run.restarts == 1 and run.state == "succeeded" and run.estimate["gpu_total"] == 1.5e9
    assert set(run.memory) == {0, 1} and run.memory_source == "rss"
    assert run.steps[1]["mem_peak_rank0"] == 6e8 + 1e7 * 1  # the memory reported before step 2's metrics
    assert run.memory[1] == 6e8 + 1e7 * 6 + 1e6


def test_metrics_cli_json_csv_and_text_without_a_cluster(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    write_run(tmp_path, "run-a", steps=3)
    capsys.readouterr()
    runner = CliRunner()
    out = runner.invoke(main, ["jobs", "metrics", "run-a", "--storage", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3] and set(data["memory"]) == {"0", "1"}
    csv = runner.invoke(main, ["jobs", "metrics", "run-a", "--storage", str(tmp_path), "--csv"]).output.splitlines()
    assert csv[0].split(",")[:3] == ["step", "loss", "samples_per_s"] and len(csv) == 4
    assert "mem_peak_rank1" in csv[0]
    text = runner.invoke(main, ["jobs", "metrics", "run-a", "--storage", str(tmp_path)]).output
    assert "step 3  loss 4.7000" in text and "peak RSS: rank 0" in text
    missing = runner.invoke(main, ["jobs", "metrics", "no-such-run", "--storage", str(tmp_path)])
    assert missing.exit_code != 0 and "no record" in missing.output


def _pixels(path):
    from matplotlib import image

    return image.imread(str(path))


def test_plot_and_compare_write_pictures_with_content(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "home"))
    write_run(tmp_path, "zero2", steps=8)
    write_run(tmp_path, "zero3", steps=8, gpu=True, loss0=5.5)
    capsys.readouterr()
    runner = CliRunner()
    png = tmp_path / "run.png"
    out = runner.invoke(main, ["jobs", "plot", "zero2", "--storage", str(tmp_path), "-o", str(png)])
    assert out.exit_code == 0, out.output
    pixels = _pixels(png)
    assert pixels.shape[0] >= 600 and pixels.shape[1] >= 600
    rgb = pixels[..., :3]
    assert (rgb < 0.5).mean() > 0.005  # lines, text and axes drawn, not a white page
    assert len({tuple(px) for px in rgb.reshape(-1, 3)[::7]}) > 20  # several colours: curves, not only text
    svg = tmp_path / "run.svg"
    assert runner.invoke(main, ["jobs", "plot", "zero2", "--storage", str(tmp_path), "-o", str(svg)]).exit_code == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<path" in svg.read_text()
    cmp_png = tmp_path / "cmp.png"
    out = runner.invoke(main, ["jobs", "compare", "zero2", "zero3", "--storage", str(tmp_path), "-o", str(cmp_png)])
    assert out.exit_code == 0, out.output
    assert (_pixels(cmp_png)[..., :3] < 0.5).mean() > 0.005
    bad = runner.invoke(main, ["jobs", "plot", "zero2", "--storage", str(tmp_path), "-o", str(tmp_path / "x.gif")])
    assert bad.exit_code == 2 and "-o" in bad.output and ".png or .svg" in bad.output


def test_matplotlib_is_not_imported_by_the_cli_at_start():
    import subprocess
    import sys

    code = "import sys, raytrain.cli.main; print('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
