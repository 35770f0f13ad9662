"""The Feeder's state (raytrain.runtime.datasets.feed.Feed) and the driver's checks, without a Ray cluster."""
import threading
import time

import numpy as np
import pyarrow as pa

from raytrain.runtime.datasets.feed import Feed, to_numpy
from raytrain.runtime.datasets.source import check_rows, cpus_per_task


def test_blocks_are_handed_out_in_order_as_soon_as_they_exist():
    feed = Feed("--data train=x.jsonl")

    def produce():
        for i in range(3):
            time.sleep(0.05)
            feed.add(f"ref{i}", 0, None, 10)
        feed.finish()

    threading.Thread(target=produce).start()
    got, index = [], 0
    while True:
        blocks, done, error = feed.since(index, timeout=5)
        assert error is None
        if not blocks and done:
            break
        got += [ref for ref, _, _, _ in blocks]
        index += len(blocks)
    assert got == ["ref0", "ref1", "ref2"] and feed.rows == 30


def test_a_reader_restarting_at_any_block_gets_the_cached_rest():
    feed = Feed("w")
    for i in range(4):
        feed.add(i, 2 * i, 2 * i + 2, 2)
    feed.finish()
    assert feed.since(1, timeout=0)[0] == [(1, 2, 4, 2), (2, 4, 6, 2), (3, 6, 8, 2)]
    assert feed.since(4, timeout=0) == ([], True, None)  # the end, at once


def test_progress_waits_for_enough_rows_not_for_the_whole_dataset():
    feed = Feed("w")
    feed.add("a", 0, None, 3)
    started = time.monotonic()
    assert feed.progress(3, timeout=5) == (3, False, None)
    assert time.monotonic() - started < 1
    assert feed.progress(4, timeout=0.2) == (3, False, None)  # not there yet: the caller asks again
    feed.finish("--data train=x: reading/preprocessing failed: boom")
    assert feed.progress(float("inf"), timeout=5) == (3, True, "--data train=x: reading/preprocessing failed: boom")


def test_check_rows_names_the_dataset_and_what_would_work():
    where = "--data train=/d/empty.jsonl"
    assert check_rows(where, 0, True, None, 2, 2) == f"{where}: the dataset is empty (after preprocessing); give a file with rows"
    assert "3 row(s) is fewer than one micro-batch on every data-parallel rank (2 x 2)" in check_rows(where, 3, True, None, 2, 2)
    assert check_rows(where, 4, False, None, 2, 2) is None and check_rows(where, 3, False, None, 2, 2) is None
    assert check_rows(where, 9, True, "boom", 2, 2) == "boom"


def test_cpus_per_task_of_something_else_assumes_ray_datas_default():
    # (a real Dataset cannot be built without starting Ray: tests/e2e/test_data.py checks that the read of a
    # dataset without preprocess streams beside 2 workers holding both CPUs of the cluster)
    assert cpus_per_task(object()) == 1


def test_to_numpy_cuts_a_block_slice():
    block = pa.table({"id": list(range(6)), "x": [[float(i)] * 2 for i in range(6)]})
    whole = to_numpy(block, 0, None)
    assert whole["id"].tolist() == list(range(6))
    part = to_numpy(block, 2, 5)
    assert part["id"].tolist() == [2, 3, 4] and np.asarray(part["x"][0]).tolist() == [2.0, 2.0]
