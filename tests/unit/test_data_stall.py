"""A --data feed that makes no progress gives up after --data-timeout, naming what it waits for, and Ray Data's
tasks ask for the CPUs that are free, not the cluster's totals (issue 40's data-feed hang)."""
import threading
import time

import pytest

from raytrain.config import Options, resolve
from raytrain.errors import ConfigError
from raytrain.runtime.datasets.feed import Feed, watch_stall
from raytrain.runtime.datasets.source import spare_cpus
from tests.conftest import JOBS


def test_a_stalled_feed_ends_with_an_error_naming_the_pending_tasks():
    feed = Feed("--data train=x.jsonl", stall_s=0.3)
    feed.add("ref0", 0, None, 4)  # progress, then nothing
    watcher = threading.Thread(target=watch_stall, args=(feed, lambda: "Ray Data tasks pending: ReadJSON x2"))
    started = time.monotonic()
    watcher.start()
    blocks, done, error = feed.since(1, timeout=10)  # what a waiting worker gets
    assert done and not blocks and time.monotonic() - started < 5
    assert error.startswith("--data train=x.jsonl: reading/preprocessing produced no new rows for ")
    assert "(--data-timeout 0.3); Ray Data tasks pending: ReadJSON x2" in error
    feed.add("late", 0, None, 4)  # a block after giving up changes nothing
    assert feed.since(1, timeout=0) == ([], True, error)


def test_a_feed_that_progresses_or_has_no_limit_never_gives_up():
    feed = Feed("--data train=x.jsonl", stall_s=0.4)
    watcher = threading.Thread(target=watch_stall, args=(feed, lambda: "pending"), daemon=True)
    watcher.start()
    for i in range(6):
        time.sleep(0.1)
        feed.add(f"ref{i}", 0, None, 1)
    feed.finish()
    watcher.join(5)
    assert feed.error is None and not watcher.is_alive()
    unlimited = Feed("w", stall_s=0)
    watch_stall(unlimited, lambda: "x")  # returns at once: nothing to watch
    assert unlimited.stalled_for(time.monotonic() + 1e6) is None


def test_a_state_api_failure_still_gives_up():
    feed = Feed("w", stall_s=0.05)

    def broken():
        raise RuntimeError("dashboard down")

    watch_stall(feed, broken, poll_s=0.05)
    assert "which Ray Data tasks are pending is unknown (the state API failed: dashboard down)" in feed.error


def test_ray_data_tasks_count_the_cpus_that_are_free():
    assert spare_cpus(available=4, total=4, workers=2) == 2
    assert spare_cpus(available=2, total=4, workers=2) == 0  # another job holds 2: the tasks ask for 0
    assert spare_cpus(available=1, total=4, workers=2) == -1


def test_data_timeout_is_an_option_with_a_default_and_checked(tmp_path):
    (tmp_path / "d.jsonl").write_text("{}\n")
    base = dict(job=str(JOBS / "cnn.py"), data={"train": str(tmp_path / "d.jsonl")})
    assert resolve(Options(**base)).data_timeout_s == 600.0
    assert resolve(Options(**base, data_timeout=30)).data_timeout_s == 30.0
    with pytest.raises(ConfigError, match="--data-timeout -1: must be a finite number >= 0"):
        resolve(Options(**base, data_timeout=-1))


def test_a_dataset_is_read_in_blocks_of_about_a_64th_between_1_and_32_mib(tmp_path):
    from raytrain.runtime.datasets.source import block_bytes

    for i in range(5):
        (tmp_path / f"p{i}.parquet").write_bytes(b"x" * 100)
    (tmp_path / "README.md").write_text("not data")
    assert block_bytes({"path": str(tmp_path), "format": "parquet"}) == 1 << 20  # small: 1 MiB
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(640 << 20)
    assert block_bytes({"path": str(big), "format": "json"}) == 10 << 20
    with open(big, "wb") as f:
        f.truncate(4 << 30)
    assert block_bytes({"path": str(big), "format": "json"}) == 32 << 20
    assert block_bytes({"path": "s3://b/x.parquet", "format": "parquet"}) == 32 << 20
