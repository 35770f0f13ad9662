"""Options are declared once (raytrain.config.options): the Click flags, config-file keys, error names and
defaults all come from that declaration. The Plan travels as JSON and reads back with its defaults."""
import dataclasses
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.cli.options import generated_names, options_from_flags
from raytrain.config import Options, Plan, Scaling, load_profile, resolve
from raytrain.config.options import DEFAULTS, SPECS, flag_of, help_of
from raytrain.errors import ConfigError
from tests.conftest import JOBS, ROOT

CNN = str(JOBS / "cnn.py")
FIELDS = [f.name for f in dataclasses.fields(Options)]
# `submit`'s options that are not Options fields: the profile path, output and waiting, and the target's
# Kubernetes flags (raytrain.cli.k8s).
NOT_OPTIONS = {"config", "no_wait", "dry_run", "as_json", "quiet", "verbose", "stop_on_interrupt"}


def _submit_params():
    return {p.name: p for p in main.commands["submit"].params}


def test_every_declaration_is_an_options_field_and_back():
    assert list(SPECS) == FIELDS


def test_every_flagged_option_has_exactly_one_click_flag_named_by_the_declaration():
    params = _submit_params()
    for name, spec in SPECS.items():
        if not spec.flag:  # the JOB and JOB_ARGS arguments, and config-file keys
            assert name not in params or not params[name].opts[0].startswith("-"), f"{name} has a flag"
            continue
        assert name in params, f"Options.{name} has no `raytrain submit` flag"
        param = params[name]
        assert param.opts == [flag_of(name)], (name, param.opts)
        assert param.secondary_opts == ([f"--no-{flag_of(name)[2:]}"] if spec.switch else [])
    flags = [opt for p in params.values() for opt in p.opts + p.secondary_opts]
    assert len(flags) == len(set(flags)), "a flag is declared twice"
    for name in params:
        assert name in SPECS or name in NOT_OPTIONS or name.startswith("k8s"), f"undeclared submit option {name}"


def test_generated_flags_carry_the_declared_help_type_and_choices():
    params = _submit_params()
    assert generated_names()[0] == "workers" and "address" not in generated_names()
    for name in generated_names():
        spec, param = SPECS[name], params[name]
        assert param.help == help_of(name)
        assert "{default}" not in param.help
        if spec.choices:
            assert list(param.type.choices) == list(spec.choices)
        assert param.multiple == spec.multiple


def test_a_flag_not_given_stays_none_so_profiles_and_defaults_can_fill_it(raytrain_home):
    ctx = main.commands["submit"].make_context("submit", [CNN, "--dry-run"])
    assert ctx.params["dry_run"] is True
    for name in generated_names():
        assert ctx.params[name] in (None, ()), (name, ctx.params[name])
    flags = {k: v for k, v in ctx.params.items() if k not in ("job", "job_args")}
    assert options_from_flags(CNN, (), **flags) == Options(job=CNN)


def test_help_shows_the_declared_defaults():
    assert help_of("timeout").endswith("Default 600.") and DEFAULTS["timeout"] == 600.0
    assert help_of("zero") == "ZeRO stage 0-3. Default 1."
    assert help_of("cpus_per_worker") == "CPUs reserved per worker. Default 1."
    assert help_of("placement").endswith("Default pack.")


def test_flag_of_is_the_flag_or_the_config_file_key():
    assert flag_of("micro_batch") == "--micro-batch"
    assert flag_of("hpz_partition_size") == "hpz_partition_size"
    assert flag_of("address") == "--address"


def _sample(name):
    """A value for option ``name``, from its declaration alone (a new option needs no new sample)."""
    spec = SPECS[name]
    if name == "job_args":
        return ["--steps", "1"]
    if name in ("env", "data"):  # mappings
        return {"A": "b"}
    if spec.choices:
        return spec.choices[-1]
    if spec.switch or spec.type is bool:
        return True
    return {int: 2, float: 0.5, "path": f"/abs/{name}"}.get(spec.type, f"{name}-value")


def test_every_field_is_a_config_file_key_with_dashes_or_underscores(tmp_path):
    samples = {name: _sample(name) for name in FIELDS}
    for dashes in (False, True):
        p = tmp_path / f"p{dashes}.json"
        p.write_text(json.dumps({(k.replace("_", "-") if dashes else k): v for k, v in samples.items()}))
        assert load_profile(p) == Options(**samples)


def test_a_config_file_key_typo_is_refused_naming_the_known_keys(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("micro-bacth: 2\n")
    with pytest.raises(ConfigError) as err:
        load_profile(p)
    msg = str(err.value)
    assert err.value.flag == "--config" and "unknown key 'micro-bacth'" in msg
    assert msg.endswith("known keys: " + ", ".join(sorted(k.replace("_", "-") for k in FIELDS)))


def test_every_flag_reaches_its_option():
    flagged = [n for n, s in SPECS.items() if s.flag]
    flags = {name: _sample(name) for name in flagged}
    flags["env"] = ("A=1", "B=x=y")  # as Click gives a repeatable flag
    flags["data"] = ("train=a.jsonl", "eval=b=c.csv")
    flags["track"] = ("mlflow", "tensorboard", "mlflow")
    opts = options_from_flags("job.py", ("--x",), **flags)
    expected = {**flags, "env": {"A": "1", "B": "x=y"}, "data": {"train": "a.jsonl", "eval": "b=c.csv"},
                "track": ["mlflow", "tensorboard"], "job": "job.py", "job_args": ["--x"]}
    assert {k: getattr(opts, k) for k in expected} == expected
    assert all(getattr(opts, n) is None for n, s in SPECS.items() if not s.flag and n not in ("job", "job_args"))
    with pytest.raises(ConfigError, match="--env NOEQ: expected KEY=VALUE"):
        options_from_flags("job.py", (), env=("NOEQ",))
    with pytest.raises(ConfigError, match="--track neptune: not a tracker; use one of tensorboard, mlflow, wandb"):
        options_from_flags("job.py", (), track=("neptune",))


def test_flags_win_over_the_profile(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("workers: 2\nzero: 3\nenv:\n  A: profile\n  B: profile\n")
    opts = options_from_flags(CNN, (), config=str(p), zero=1, env=("A=flag",))
    assert (opts.workers, opts.zero, opts.env) == (2, 1, {"A": "flag", "B": "profile"})


def test_errors_in_config_name_only_declared_flags():
    """A `flag=` in raytrain/config names a declared option (its flag or key), so renaming one is caught."""
    known = {flag_of(n) for n in SPECS} | {"--config", "JOB"}
    used = set()
    for path in (ROOT / "raytrain" / "config").glob("*.py"):
        used |= set(re.findall(r'flag="([^"]+)"', path.read_text()))
    assert used and used <= known, used - known


def test_submit_help_lists_flags_in_declaration_order(raytrain_home):
    out = CliRunner().invoke(main, ["submit", "--help"]).output
    order = ["--address"] + [flag_of(n) for n in generated_names()]
    order.insert(order.index("--ds-config") + 1, "--config")
    positions = [out.index(f"  {flag} ") for flag in order]
    assert positions == sorted(positions)


# --- the Plan: one set of defaults, JSON round trip ---


def test_plan_defaults_are_the_declared_defaults():
    defaults = {f.name: f.default for f in dataclasses.fields(Plan)}
    assert defaults["timeout_s"] == DEFAULTS["timeout"]
    assert defaults["checkpoint_every"] == DEFAULTS["checkpoint_every"]
    assert defaults["max_failures"] == DEFAULTS["max_failures"]
    assert defaults["pp_partition"] == DEFAULTS["pp_partition"]
    assert defaults["activation_checkpointing"] == DEFAULTS["activation_checkpointing"]
    assert Scaling(1, False, {"CPU": 1.0}).placement_strategy == "PACK"
    p = resolve(Options(job=CNN))
    assert (p.timeout_s, p.checkpoint_every, p.max_failures, p.pp_partition, p.scaling.placement_strategy) == (
        600.0, 0, 0, "parameters", "PACK"
    )


@pytest.mark.parametrize("kw", [{}, {"workers": "1-2"}, {"workers": 2, "zero": 3, "precision": "bf16",
                                                          "env": {"A": "b"}, "keep": 2, "resume": "r"}])
def test_plan_round_trips_through_dict_and_json(kw):
    p = resolve(Options(job=CNN, **kw))
    assert Plan.from_dict(p.to_dict()) == p
    assert Plan.from_dict(json.loads(p.to_json())) == p
    assert Plan.from_json(p.to_json()) == p
    assert Plan.from_dict(p.to_dict()).to_json() == p.to_json()


def test_plan_from_dict_fills_missing_fields_with_the_defaults():
    data = resolve(Options(job=CNN, timeout=5)).to_dict()
    for key in ("timeout_s", "checkpoint_every", "max_failures", "pp_partition", "keep", "interface", "mode"):
        data.pop(key)
    data["scaling"].pop("placement_strategy")
    p = Plan.from_dict(data)
    assert (p.timeout_s, p.checkpoint_every, p.max_failures, p.pp_partition, p.keep, p.mode) == (
        DEFAULTS["timeout"], 0, 0, "parameters", None, "train"
    )
    assert p.scaling.placement_strategy == "PACK"


def test_the_driver_reads_a_typed_plan_with_the_declared_defaults(monkeypatch):
    from raytrain.runtime.driver import entrypoint as driver  # imports neither ray nor deepspeed at import time

    data = resolve(Options(job=CNN, workers=2, max_failures=2)).to_dict()
    monkeypatch.setenv("RAYTRAIN_PLAN", json.dumps(data))
    p = driver.read_plan()
    assert isinstance(p, Plan) and isinstance(p.scaling, Scaling)
    assert p.max_failures == 2 and p.scaling.num_workers == 2 and p.to_dict() == data
    del data["timeout_s"], data["max_failures"]
    monkeypatch.setenv("RAYTRAIN_PLAN", json.dumps(data))
    p = driver.read_plan()
    assert p.timeout_s == DEFAULTS["timeout"] and p.max_failures == DEFAULTS["max_failures"]
    source = Path(driver.__file__).read_text()
    assert "plan.get(" not in source and "or 600" not in source, "the driver repeats a default"
