"""Every rank's stdout and stderr, also kept in the run's record (``<run>/raytrain/logs/rank-N.log``), so that
`jobs logs ID --rank N` (or ``--node``) works after the cluster has stopped and a failure can show the failing
rank's last lines. Python-level writes (print, logging, tracebacks, tqdm) are copied; Ray still gets all."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO


class Tee:
    """Writes go to ``stream`` (what Ray captures) and to ``copy``; a failing copy never fails the job. Not an
    io class: everything else (fileno, isatty, encoding, buffer) is the real stream's."""

    def __init__(self, stream: TextIO, copy: TextIO):
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        try:
            self.copy.write(text)
            self.copy.flush()
        except (OSError, ValueError):
            pass
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def header(rank: int, host: str, ip: str) -> str:
    return f"# raytrain rank {rank} on {host} ({ip}) at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"


def start(record_dir: Path | None, rank: int, ip: str = "") -> Path | None:
    """Copy this process's stdout/stderr to ``record_dir``/logs/rank-N.log (appended: a restart adds to it)."""
    if record_dir is None:
        return None
    try:
        path = record_dir / "logs" / f"rank-{rank}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        copy = open(path, "a", buffering=1, errors="replace")
    except OSError:
        return None
    copy.write(header(rank, socket.gethostname(), ip))
    sys.stdout = Tee(sys.stdout, copy)
    sys.stderr = Tee(sys.stderr, copy)
    return path
