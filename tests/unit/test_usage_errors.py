"""Click's own usage errors look like raytrain's: one line `raytrain: error: ...; see `raytrain CMD --help``,
exit 2, no "Usage:" block; and `export` names its own CHECKPOINT argument, not --resume."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main


@pytest.mark.parametrize("args,line", [
    (["submit", "job.py", "--frob"],
     "raytrain: error: no such option '--frob' (did you mean one of: '--rayjob', '--zero'?); "
     "see `raytrain submit --help`"),
    (["export"], "raytrain: error: missing argument 'CHECKPOINT'; see `raytrain export --help`"),
    (["submit", "job.py", "--precision", "fp64"],
     "raytrain: error: invalid value for '--precision': 'fp64' is not one of 'fp32', 'bf16', 'fp16'; "
     "see `raytrain submit --help`"),
    (["nosuch"], "raytrain: error: no such command 'nosuch'; see `raytrain --help`"),
    (["jobs", "stop"], "raytrain: error: missing argument 'JOB_ID'; see `raytrain jobs stop --help`"),
    (["--bogus"], "raytrain: error: no such option '--bogus'; see `raytrain --help`"),
    (["submit", "job.py", "--zero", "x"],
     "raytrain: error: invalid value for '--zero': 'x' is not a valid integer; see `raytrain submit --help`"),
])
def test_click_usage_errors_are_one_raytrain_line_exit_2(raytrain_home, args, line):
    result = CliRunner().invoke(main, args, prog_name="python -m raytrain.cli.main")
    assert result.exit_code == 2
    assert result.output.strip() == line


def test_a_group_without_its_command_still_shows_its_help(raytrain_home):
    result = CliRunner().invoke(main, ["jobs"])
    assert "Usage:" in result.output and "stop" in result.output


def test_export_names_its_checkpoint_argument(raytrain_home, tmp_path):
    result = CliRunner().invoke(main, ["export", "no-such-run", "--out", str(tmp_path / "m.pt")])
    assert result.exit_code == 2
    assert result.output.startswith("raytrain: error: CHECKPOINT no-such-run: no such run or checkpoint")
    assert "--resume" not in result.output
