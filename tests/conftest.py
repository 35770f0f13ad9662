from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"


@pytest.fixture
def raytrain_home(tmp_path, monkeypatch):
    """A private RAYTRAIN_HOME so unit tests never see a user's cluster record."""
    home = tmp_path / "rthome"
    monkeypatch.setenv("RAYTRAIN_HOME", str(home))
    monkeypatch.delenv("RAYTRAIN_ADDRESS", raising=False)
    return home
