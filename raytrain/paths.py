"""Where raytrain keeps its local state (the embedded cluster's record, its auth token, default storage)."""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """``$RAYTRAIN_HOME`` or ``~/.raytrain``; created on first use with owner-only permissions."""
    path = Path(os.environ.get("RAYTRAIN_HOME") or Path.home() / ".raytrain").expanduser()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def default_storage() -> Path:
    """Default Ray Train storage for runs on the embedded local cluster."""
    return home() / "runs"
