from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"


@pytest.fixture
def raytrain_home(tmp_path_factory, monkeypatch):
    """A private RAYTRAIN_HOME so unit tests never see a user's cluster record. Not under ``tmp_path``:
    tests write job files there, and a job folder holding RAYTRAIN_HOME is refused (it would be uploaded)."""
    home = tmp_path_factory.mktemp("rthome")
    monkeypatch.setenv("RAYTRAIN_HOME", str(home))
    monkeypatch.delenv("RAYTRAIN_ADDRESS", raising=False)
    return home
