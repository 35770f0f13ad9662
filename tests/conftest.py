import fcntl
import importlib.util
import json
import os
import socket
import time
from contextlib import contextmanager
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


# -- skips ---------------------------------------------------------------------------------------------
# A skip may only stand for something the test extra cannot install: a Kubernetes API server, root (network
# namespaces), a GPU, a machine shape. Such skips carry a "[needs ...]" reason (needs()) and are listed
# after every run. Any other skip (a missing ray, transformers, wandb: a broken install) is a failure under
# CI=true, so a broken environment cannot turn the suite green.
NEEDS = "[needs "


def needs(what: str, reason: str) -> str:
    """A skip reason for a test that cannot run on this machine: ``pytest.skip(needs("root", "..."))``."""
    return f"{NEEDS}{what}] {reason}"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and _in_ci():
        reason = _skip_reason(report)
        if not reason.startswith(NEEDS):
            report.outcome = "failed"
            report.longrepr = (f"CI=true: {item.nodeid} was skipped ({reason}); under CI a skip of anything "
                               f"the test extra installs is a failure (only '{NEEDS}...]' skips are allowed)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say which suites did not run and why, even without -rs: a skipped suite is never silent."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.write_sep("-", "not run on this machine")
        for reason, count in sorted(reasons.items()):
            terminalreporter.write_line(f"{count:4d} skipped: {reason}")


# -- tests side by side (`pytest -n 2`, pytest-xdist) ------------------------------------------------------
# The e2e tests wait on Ray more than they use the cores, so two run at once, each xdist worker with its own
# session cluster (tests/e2e/conftest.py). A work unit is a test file (its module fixtures are set up once),
# or a whole folder for the tests that share one fixed thing: tests/multinode its network namespace and
# addresses, tests/k8s the API server's objects. Long units go first (the two-node tests, then the e2e files),
# the unit tests last, where they fill the gaps. A test marked `alone` measures time (a rank's speed against
# the others'): it runs with no other test at the same time.
FOLDER_UNITS = ("multinode", "k8s")
ORDER = ("multinode", "e2e", "k8s", "bench", "unit")  # under -n; other folders after these


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


@pytest.hookimpl(tryfirst=True)  # before tests/e2e/conftest.py orders its own block
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out units in this order
        rank = {name: i for i, name in enumerate(ORDER)}
        items.sort(key=lambda item: rank.get(_folder(item.nodeid), len(ORDER)))


if importlib.util.find_spec("xdist") is not None:  # the test extra installs it; plain pytest runs without
    from xdist.scheduler import LoadScopeScheduling

    class _Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            folder = _folder(nodeid)
            return f"tests/{folder}" if folder in FOLDER_UNITS else nodeid.split("::", 1)[0]

    def pytest_xdist_make_scheduler(config, log):
        config.option.loadscopereorder = False  # the collection's order (above), not the units' sizes
        return _Units(config, log)


@contextmanager
def _side_by_side(folder: Path, alone: bool):
    """Shared hold of the room for a test, exclusive for an `alone` one. Everyone passes the gate one at a
    time, so an `alone` test waiting for the room keeps new tests out rather than waiting behind them. The
    wait is bounded by the other worker's test, which pytest-timeout bounds."""
    with open(folder / "side-by-side.gate", "a") as gate, open(folder / "side-by-side.room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: nothing runs beside this test
        yield
        return
    # The workers' base temp folders are siblings (.../pytest-N/popen-gwK): their parent is the run's own
    folder = item.config._tmp_path_factory.getbasetemp().parent
    with _side_by_side(folder, alone=item.get_closest_marker("alone") is not None):
        yield


# -- the suite's clusters --------------------------------------------------------------------------------
def free_port(avoid: set[int] = frozenset()) -> int:
    """A TCP port free on this machine now (the kernel's pick), for a cluster this run starts: never a fixed
    port, which another checkout's cluster may hold."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def record_cluster(home: Path, temp_dir: Path, port, dashboard_port, what: str, **extra: str) -> None:
    """Append the RAYTRAIN_HOME of a cluster this run starts to $RAYTRAIN_TEST_RECORDS (if set), one JSON
    line: .ci/run stops each with `raytrain cluster down --force` under that RAYTRAIN_HOME (the head's own
    record there names its process), so nothing is stopped by a name or port pattern."""
    path = os.environ.get("RAYTRAIN_TEST_RECORDS")
    if not path:
        return
    line = {"what": what, "home": str(home), "temp_dir": str(temp_dir), "port": int(port),
            "dashboard_port": int(dashboard_port), "pytest_pid": os.getpid(), "at": time.time(), **extra}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
