"""Under CI=true a skip that does not say it needs something the test extra cannot install fails the run
(tests/conftest.py), and every skip's reason is printed after the run without -rs."""
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SAMPLE = textwrap.dedent('''
    import pytest
    from tests.conftest import needs

    def test_a_broken_install():
        pytest.importorskip("raytrain_no_such_module")

    def test_needs_root():
        pytest.skip(needs("root", "two-node tests need root"))

    def test_passes():
        pass
''')


def _run(tmp_path, ci: str | None):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_under_ci_a_skip_of_an_installable_dependency_fails(tmp_path):
    proc = _run(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed, 1 skipped" in proc.stdout
    assert "CI=true: " in proc.stdout and "test_a_broken_install was skipped" in proc.stdout
    assert "[needs root] two-node tests need root" in proc.stdout  # the allowed skip, with its reason


def test_outside_ci_skips_are_listed_with_their_reasons(tmp_path):
    proc = _run(tmp_path, None)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 2 skipped" in proc.stdout
    assert "not run on this machine" in proc.stdout
    assert "raytrain_no_such_module" in proc.stdout and "[needs root]" in proc.stdout
