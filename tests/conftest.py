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


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test leaves os.environ as it found it: code under test that sets the launcher's variables
    (MASTER_ADDR, RANK, ...) in-process would otherwise leak them into later tests (a leaked
    MASTER_ADDR=10.0.0.1 once made gpu_mfu's single-rank smoke test wait for a rendezvous until its timeout)."""
    import os

    saved = dict(os.environ)
    yield
    if os.environ != saved:
        # W&B's in-process service (a singleton that outlives the test) keeps its address in WANDB_SERVICE:
        # its variables stay as W&B left them, or the next W&B run in this process loses its service
        kept = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k not in saved}
        os.environ.clear()
        os.environ.update(saved)
        os.environ.update(kept)
