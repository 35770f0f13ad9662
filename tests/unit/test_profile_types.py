"""`--config` profile values are type-checked against their declarations (raytrain.config.options), the
same for YAML, TOML and JSON: the wrong type is one line naming the file, key, value and what would work,
exit 2 from the CLI; nothing is converted (a quoted "no" is never read as true)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.config import load_profile
from raytrain.config.options import SPECS
from raytrain.errors import ConfigError

JOB = "def train(ctx):\n    pass\n"

BAD = [  # key, YAML value, what the message must say would work
    ("name", "123", "expected a string"),
    ("address", "8265", "expected a string (URL)"),
    ("ds-config", "5", 'a file path as a string (ds-config: "ds.json")'),
    ("activation-checkpointing", '"no"', "expected true or false, unquoted"),
    ("activation-checkpointing", '"yes"', "expected true or false, unquoted"),
    ("script", '"false"', "expected true or false, unquoted"),
    ("quantized-weights", "1", "expected true or false"),
    ("zero", "true", "expected a whole number"),
    ("zero", '"2"', "expected a whole number"),
    ("micro-batch", "1.5", "expected a whole number"),
    ("timeout", '"600"', "expected a number"),
    ("workers", "[2, 4]", "expected a whole number or a string (N|MIN-MAX)"),
    ("precision", "fp64", "expected one of fp32, bf16, fp16"),
    ("env", "[A=1]", "expected a mapping"),
    ("env", "{A: {B: 1}}", "expected a mapping"),
    ("job-args", "--steps", "expected a list of strings"),
]


@pytest.mark.parametrize("key,value,expected", BAD)
def test_a_value_of_the_wrong_type_is_refused_naming_file_key_value_and_what_works(tmp_path, key, value, expected):
    p = tmp_path / "profile.yaml"
    p.write_text(f"{key}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_profile(p)
    msg = str(err.value)
    assert err.value.flag == "--config"
    assert msg.startswith(f"--config {p}: {key}: ") and expected in msg, msg


@pytest.mark.parametrize("suffix,text", [
    (".toml", 'name = 123\n'),
    (".json", '{"name": 123}'),
    (".yaml", "submit:\n  name: 123\n"),
])
def test_every_format_is_checked_alike(tmp_path, suffix, text):
    p = tmp_path / f"profile{suffix}"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"name: 123 is a number; expected a string"):
        load_profile(p)


def test_right_types_pass_and_ints_count_as_numbers(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({
        "workers": "2-4", "cpus-per-worker": 2, "timeout": 30, "activation-checkpointing": False,
        "env": {"A": 1, "B": "x"}, "job-args": ["--steps", 10], "name": "run-1",
    }))
    opts = load_profile(p)
    assert opts.workers == "2-4" and opts.cpus_per_worker == 2 and opts.activation_checkpointing is False
    assert opts.job_args == ["--steps", "10"]


def test_every_declared_option_has_a_checked_type():
    from raytrain.config.config_file_types import ACCEPTED

    assert set(ACCEPTED) == set(SPECS) and all(ACCEPTED.values())


@pytest.mark.parametrize("key,value", [("name", "123"), ("address", "8265"), ("ds-config", "5"),
                                       ("activation-checkpointing", '"no"')])
def test_the_cli_says_one_line_and_exits_2_instead_of_a_traceback(tmp_path, raytrain_home, key, value):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    p = tmp_path / "profile.yaml"
    p.write_text(f"{key}: {value}\n")
    result = CliRunner().invoke(main, ["submit", str(job), "--config", str(p), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raytrain: error: --config {p}: {key}: "), result.output
