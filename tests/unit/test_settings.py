"""Every RAYTRAIN_* variable is declared once (raytrain/settings.py), read only through it, and documented by
the page generated from it."""
import ast
import re
from pathlib import Path

import pytest

from raytrain import settings
from raytrain.errors import ConfigError
from tests.conftest import ROOT

PACKAGE = ROOT / "raytrain"
NAME = re.compile(r"RAYTRAIN_[A-Z0-9_]*[A-Z0-9]")
# A stdlib-only script Ray runs before any raytrain import is possible: it spells its one name itself.
STDLIB_ONLY = {PACKAGE / "ray_tuning" / "ray_setup_worker.py"}


def _sources():
    return [p for p in PACKAGE.rglob("*.py") if p.name != "settings.py"]


def test_every_name_the_code_and_the_install_script_use_is_declared():
    files = [*_sources(), *(ROOT / "scripts").iterdir()]
    undeclared = {f"{p.relative_to(ROOT)}: {m}" for p in files for m in NAME.findall(p.read_text())
                  if m not in settings.SETTINGS}
    assert not undeclared, sorted(undeclared)


def _module_constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _environ_reads(path: Path) -> list[str]:
    """``os.environ[X]``, ``os.environ.get(X)`` (also ``pop``, ``setdefault``), ``os.getenv(X)`` or ``getenv(X)``,
    ``X in os.environ``, where X is a RAYTRAIN_ literal, an f-string starting with one, or a module constant
    holding one."""
    tree = ast.parse(path.read_text())
    consts = _module_constants(tree)

    def raytrain_name(node) -> str | None:
        if isinstance(node, ast.JoinedStr) and node.values:  # f"RAYTRAIN_{x}"
            node = node.values[0]
        value = node.value if isinstance(node, ast.Constant) else consts.get(node.id) if isinstance(node, ast.Name) else None
        return value if isinstance(value, str) and value.startswith("RAYTRAIN_") else None

    def getenv(func) -> bool:
        return (isinstance(func, ast.Name) and func.id == "getenv") or (
            isinstance(func, ast.Attribute) and (func.attr == "getenv" or (
                func.attr in ("get", "pop", "setdefault") and "environ" in ast.unparse(func.value))))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and "environ" in ast.unparse(node.value):
            name = raytrain_name(node.slice)
        elif isinstance(node, ast.Call) and node.args and getenv(node.func):
            name = raytrain_name(node.args[0])
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and "environ" in ast.unparse(node.comparators[0])):
            name = raytrain_name(node.left)
        else:
            continue
        if name:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_no_module_reads_a_raytrain_variable_but_through_settings():
    reads = [r for p in _sources() if p not in STDLIB_ONLY for r in _environ_reads(p)]
    assert not reads, reads


def test_the_scan_finds_a_direct_read(tmp_path):
    planted = ROOT / "raytrain" / "_planted_read_for_test.py"
    planted.write_text('import os\nfrom os import getenv\nX = "RAYTRAIN_PORT"\na = os.environ.get(X)\n'
                       'b = os.environ["RAYTRAIN_HOME"]\nc = os.getenv("RAYTRAIN_VERBOSE", "0")\n'
                       'd = request_env.get("RAYTRAIN_JOB_CODE")\ne = "RAYTRAIN_PLAN" in os.environ\n'
                       'f = getenv(f"RAYTRAIN_{X}")\ng = os.environ.setdefault("RAYTRAIN_RUN_NAME", "x")\n'
                       'h = os.environ.get("HOME")\n')
    try:
        assert [r.split(": ")[1] for r in _environ_reads(planted)] == [
            "RAYTRAIN_PORT", "RAYTRAIN_HOME", "RAYTRAIN_VERBOSE", "RAYTRAIN_PLAN", "RAYTRAIN_", "RAYTRAIN_RUN_NAME"]
    finally:
        planted.unlink()


def test_the_stdlib_only_exemption_names_a_file_that_exists():
    assert all(p.is_file() for p in STDLIB_ONLY), STDLIB_ONLY


def test_at_most_twelve_settings_are_for_users_each_one_documented_with_where_it_applies():
    users = [s for s in settings.SETTINGS.values() if s.audience == "user"]
    assert len(users) <= 12, [s.name for s in users]
    assert all(s.applies and s.help for s in users), users


# Switches whose choice is now fixed in code, and decisions a target makes that travel in the Plan (local_cluster).
REMOVED = ("RAYTRAIN_K8S_POLL_S", "RAYTRAIN_MONITOR_INTERVAL_S", "RAYTRAIN_HF_LOG_EVERY_STEPS",
           "RAYTRAIN_TRAIN_LOG_LEVEL", "RAYTRAIN_PG_CLEANER", "RAYTRAIN_AUTOSCALING_COORDINATOR")


def test_the_removed_switches_are_neither_declared_nor_named_in_the_code_or_the_reference_docs():
    assert not set(REMOVED) & set(settings.SETTINGS)
    pages = [p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"]  # its history keeps old commands
    named = {f"{p.relative_to(ROOT)}: {n}" for p in [*_sources(), *pages] for n in REMOVED if n in p.read_text()}
    assert not named, sorted(named)


def test_the_stdlib_only_setup_worker_spells_a_declared_name():
    from raytrain.ray_tuning import ray_setup_worker

    assert ray_setup_worker.ALLOCATOR_VAR in settings.SETTINGS


def test_the_settings_page_is_generated_from_the_table():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings.markdown_page(), "run: python -m raytrain.settings > docs/settings.md"


def test_each_setting_is_declared_with_a_known_type_audience_and_help():
    for s in settings.SETTINGS.values():
        assert s.type in settings.TYPES and s.audience in settings.AUDIENCES and s.help, s
        assert (s.type == "choice") == bool(s.choices), s


def test_values_are_typed_and_defaults_apply_when_unset_or_empty():
    assert settings.get("RAYTRAIN_PORT", {}) == 6379
    assert settings.get("RAYTRAIN_PORT", {"RAYTRAIN_PORT": "7000"}) == 7000
    assert settings.get("RAYTRAIN_PORT", {"RAYTRAIN_PORT": " "}) == 6379
    assert settings.get("RAYTRAIN_JOIN_TIMEOUT_S", {"RAYTRAIN_JOIN_TIMEOUT_S": "0.5"}) == 0.5
    assert settings.get("RAYTRAIN_BIND_CORES", {}) is True
    assert settings.get("RAYTRAIN_BIND_CORES", {"RAYTRAIN_BIND_CORES": "0"}) is False
    assert settings.get("RAYTRAIN_RAY_TUNING", {}) == "on"
    assert settings.get("RAYTRAIN_RAY_TUNING", {"RAYTRAIN_RAY_TUNING": "OFF"}) == "off"
    assert settings.get("RAYTRAIN_CPU_ALLOCATOR", {"RAYTRAIN_CPU_ALLOCATOR": "JEMALLOC"}) == "jemalloc"
    assert settings.get("RAYTRAIN_HOME", {"RAYTRAIN_HOME": "~/rt"}) == str(Path("~/rt").expanduser())


@pytest.mark.parametrize("name,value,says", [
    ("RAYTRAIN_PORT", "abc", "whole number"),
    ("RAYTRAIN_JOIN_TIMEOUT_S", "nan", "finite"),
    ("RAYTRAIN_JOIN_TIMEOUT_S", "-1", "0 or more"),
    ("RAYTRAIN_BIND_CORES", "yes", "1 (on) or 0 (off)"),
    ("RAYTRAIN_RAY_TUNING", "0", "on, off"),
    ("RAYTRAIN_CPU_ALLOCATOR", "tcmalloc", "jemalloc, glibc"),
])
def test_a_malformed_value_is_a_config_error_naming_the_variable(name, value, says):
    with pytest.raises(ConfigError) as err:
        settings.get(name, {name: value})
    assert f"{name}={value}" in str(err.value) and says in str(err.value)


def test_an_undeclared_name_cannot_be_read():
    with pytest.raises(KeyError, match="not a declared raytrain setting"):
        settings.get("RAYTRAIN_NO_SUCH_THING", {})


def test_a_jobs_setting_given_with_env_is_checked_at_resolve_naming_env(tmp_path):
    from raytrain.config import Options, resolve

    job = tmp_path / "train.py"
    job.write_text("def train(ctx):\n    pass\n")
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=str(job), env={"RAYTRAIN_BIND_CORES": "yes"}))
    assert err.value.flag == "--env" and "RAYTRAIN_BIND_CORES=yes" in str(err.value) and "1 (on) or 0 (off)" in str(err.value)
    assert resolve(Options(job=str(job), env={"RAYTRAIN_BIND_CORES": "0"})).env == {"RAYTRAIN_BIND_CORES": "0"}
