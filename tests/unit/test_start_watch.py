"""The driver's start watch (``--start-timeout``) fires while Ray's state API fails: before, every failed poll
was skipped, so a job whose placement could not be seen waited for ever. The API here really fails: the
watch asks a dashboard address where nothing answers (a closed port), or one that accepts and never answers."""
import socket
import threading
import time

import pytest

from raytrain.runtime.driver import placement_watch


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def watch_until_timeout(timeout_s: float, bound_s: float) -> tuple[str | None, float]:
    fired: list[str] = []
    done = threading.Event()
    watch = placement_watch.StartWatch("01000000", timeout_s, lambda m: (fired.append(m), done.set()), poll_s=0.2)
    start = time.monotonic()
    watch.start()
    done.wait(bound_s)
    watch.stopped.set()
    return (fired[0] if fired else None), time.monotonic() - start


def test_the_start_deadline_fires_while_the_state_api_is_down(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{closed_port()}")
    message, took = watch_until_timeout(1.0, bound_s=30)
    assert message is not None, "the start watch never gave up while the state API failed"
    assert took < 30
    assert "state API" in message and "failing for" in message
    assert "last error: ServerUnavailable" in message  # Ray's own error for a dashboard it cannot reach


def test_the_start_deadline_fires_while_the_state_api_never_answers(monkeypatch):
    """A dashboard that accepts the connection and never answers: each call is bounded too."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # never accepted: the kernel completes the connection, nobody answers
    try:
        monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setattr(placement_watch, "STATE_TIMEOUT_S", 1, raising=False)
        message, took = watch_until_timeout(1.0, bound_s=30)
    finally:
        server.close()
    assert message is not None and took < 30
    assert "state API" in message and "last error:" in message
