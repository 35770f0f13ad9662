"""Shell completion (Click's) for commands, flags and job ids (issue 17)."""
from click.testing import CliRunner

from raytrain.cli.main import main


def complete(words: str) -> list[str]:
    parts = words.split(" ")
    env = {"_RAYTRAIN_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    out = CliRunner().invoke(main, [], env=env, prog_name="raytrain").output
    return [line.split(",", 1)[1] for line in out.splitlines() if "," in line]


def test_commands_flags_and_job_ids_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path))
    runs = tmp_path / "runs"
    for name in ("raytrain-gpt-zero-20261203-130750-4b8e53", "raytrain-cnn-20261203-120000-000000"):
        (runs / name).mkdir(parents=True)
    assert {"submit", "jobs", "cluster", "plan"} <= set(complete("raytrain "))
    assert {"metrics", "plot", "compare", "logs", "status"} <= set(complete("raytrain jobs "))
    assert {"--track", "--mlflow-uri", "--workers"} <= set(complete("raytrain submit --"))
    assert complete("raytrain jobs plot raytrain-gpt") == ["raytrain-gpt-zero-20261203-130750-4b8e53"]
    assert set(complete("raytrain jobs logs ")) == {p.name for p in runs.iterdir()}
    assert "tensorboard" in complete("raytrain submit --track ")
