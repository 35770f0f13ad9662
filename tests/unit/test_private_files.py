"""A run's record (events, rank logs), its trackers' files and RAYTRAIN_HOME are private to the job's user,
whatever the umask: folders 0700, files 0600 (a shared --storage would otherwise let anyone read a job's whole
output); RAYTRAIN_HOME is checked as the temp folders are."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain import paths, run_record
from raytrain.errors import UnsafePath


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o002)  # a group-shared umask: the default would make everything group-readable
    yield
    os.umask(old)


def test_the_run_record_is_private(tmp_path, open_umask):
    from raytrain import events

    storage = tmp_path / "shared"
    storage.mkdir(mode=0o775)
    path = run_record.start(str(storage), "run-1", "driver")
    try:
        events.emit("started", name="x")
    finally:
        events.record_to(None)
    assert mode(storage / "run-1") == 0o700 and mode(storage / "run-1" / "raytrain") == 0o700
    assert mode(Path(path)) == 0o600 and "started" in Path(path).read_text()
    assert mode(storage) == 0o775  # the storage itself is the user's to share


def test_a_rank_log_is_private(tmp_path, open_umask):
    record = tmp_path / "run-1" / "raytrain"
    script = ("import sys; from pathlib import Path; from raytrain.runtime.worker import rank_log\n"
              "rank_log.start(Path(sys.argv[1]), 0, '10.0.0.1'); print('secret output', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(record)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    log = record / "logs" / "rank-0.log"
    assert mode(record / "logs") == 0o700 and mode(log) == 0o600
    assert "secret output" in log.read_text()


def test_tracker_files_are_private(tmp_path, open_umask):
    pytest.importorskip("mlflow")
    from raytrain.config.plan import Plan, Scaling
    from raytrain.runtime.tracking import trackers

    plan = Plan(name="gpt", job_file="/j/gpt.py", job_dir="/j", job_module="gpt.py", job_args=[], deepspeed={},
                scaling=Scaling(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
                parallel={"dp": 1, "tp": 1, "pp": 1}, train_batch=1, precision="fp32", zero=0, offload="none",
                storage=str(tmp_path), track=["tensorboard", "mlflow"])
    t = trackers.start(plan, rank=0, run_name="run-1")
    t.finish({})
    run = tmp_path / "run-1"
    assert mode(run / "tensorboard") == 0o700 and mode(run / "mlflow") == 0o700
    assert mode(run / "raytrain" / "trackers.json") == 0o600


def test_raytrain_home_is_checked_like_the_temp_folders(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "home-link"
    link.symlink_to(real)
    monkeypatch.setenv("RAYTRAIN_HOME", str(link))
    with pytest.raises(UnsafePath, match="symbolic link.*RAYTRAIN_HOME"):
        paths.home()
    open_home = tmp_path / "open"
    open_home.mkdir()
    os.chmod(open_home, 0o777)  # ours, but anyone could drop a file in it: tightened
    monkeypatch.setenv("RAYTRAIN_HOME", str(open_home))
    assert paths.home() == open_home and mode(open_home) == 0o700
    if os.getuid() == 0:  # someone else's folder (only root can make one here)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        monkeypatch.setenv("RAYTRAIN_HOME", str(theirs))
        with pytest.raises(UnsafePath, match="belongs to uid 12345"):
            paths.home()


def test_private_helpers(tmp_path, open_umask):
    folder = paths.private_mkdir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == 0o700 and mode(folder) == 0o700
    paths.private_write(folder / "x.json", json.dumps({"a": 1}))
    assert mode(folder / "x.json") == 0o600 and json.loads((folder / "x.json").read_text()) == {"a": 1}
    old = folder / "old.log"
    old.write_text("before\n")
    os.chmod(old, 0o644)
    with paths.private_open(old, "a") as f:
        f.write("after\n")
    assert mode(old) == 0o600 and old.read_text() == "before\nafter\n"
