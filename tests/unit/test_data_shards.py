"""ctx.dataset's split (raytrain.runtime.data) without Ray: a source whose iter_batches yields numpy batches
stands in for Ray Data's DataIterator over a materialized dataset (the same rows in the same order)."""
import itertools

import numpy as np
import pytest

from raytrain.runtime.data import Position, ShardBatches, my_part, rechunk, skip_rows


class Rows:
    """A DataIterator stand-in: ``iter_batches`` yields the rows 0..n-1 in uneven blocks."""

    def __init__(self, n, block=7):
        self.n, self.block = n, block

    def iter_batches(self, *, batch_size, batch_format, prefetch_batches, drop_last):
        assert batch_format == "numpy" and not drop_last
        for start in range(0, self.n, self.block):
            ids = np.arange(start, min(start + self.block, self.n))
            yield {"id": ids, "x": ids.astype(np.float32) * 2}


def loaders(n, size, batch, position=None, **kw):
    position = position or Position()
    positions = [Position(position.epoch, position.rows) for _ in range(size)]
    return [ShardBatches(Rows(n), rank=r, size=size, batch_size=batch, position=positions[r], **kw)
            for r in range(size)], positions


def take(iterators, steps):
    """``steps`` batches from every rank, in lockstep (as data-parallel training consumes them)."""
    seen = [[] for _ in iterators]
    for _ in range(steps):
        for r, it in enumerate(iterators):
            seen[r].append(next(it)["id"].tolist())
    return seen


def flat(seen):
    return sorted(i for rank in seen for batch in rank for i in batch)


def test_rechunk_and_skip_keep_every_row_in_order():
    batches = [{"a": np.arange(s, s + 5)} for s in range(0, 23, 5)]
    out = list(rechunk(iter(batches), 4))
    assert [len(b["a"]) for b in out] == [4, 4, 4, 4, 4, 4, 1]
    assert np.concatenate([b["a"] for b in out]).tolist() == list(range(25))
    assert np.concatenate([b["a"] for b in skip_rows(iter(batches), 7)]).tolist() == list(range(7, 25))


def test_a_short_last_round_is_split_evenly_or_dropped_by_all():
    full = {"a": np.arange(12)}
    assert my_part(full, rank=1, size=3, batch_size=4)["a"].tolist() == [4, 5, 6, 7]
    short = {"a": np.arange(5)}
    assert [my_part(short, rank=r, size=3, batch_size=4)["a"].tolist() for r in range(3)] == [[0], [1, 2], [3, 4]]
    assert all(my_part({"a": np.arange(2)}, rank=r, size=3, batch_size=4) is None for r in range(3))


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_are_disjoint_and_cover_each_epoch_exactly_once(shuffle):
    its, positions = loaders(40, 2, 4, epochs=2, shuffle=shuffle, seed=3, shuffle_window=16, prefetch=2)
    iterators = [iter(x) for x in its]
    epoch0 = take(iterators, 5)
    assert flat(epoch0) == list(range(40))
    assert not set(sum(epoch0[0], [])) & set(sum(epoch0[1], []))
    assert positions[0].to_dict() == {"epoch": 0, "rows": 40}
    epoch1 = take(iterators, 5)
    assert flat(epoch1) == list(range(40))
    assert (epoch0 != epoch1) == shuffle  # a new order each epoch when shuffled
    assert all(next(it, None) is None for it in iterators)  # epochs=2: done
    assert positions[1].to_dict() == {"epoch": 2, "rows": 0}
    again = [iter(x) for x in loaders(40, 2, 4, epochs=1, shuffle=shuffle, seed=3, shuffle_window=16)[0]]
    assert take(again, 5) == epoch0  # deterministic for a seed


@pytest.mark.parametrize("prefetch", [0, 3])
def test_values_arrive_as_tensors_with_the_rows_they_belong_to(prefetch):
    import torch

    (it,), _ = loaders(10, 1, 4, epochs=1, prefetch=prefetch, map_batches=lambda b: {**b, "y": b["x"] + 1})
    batches = list(it)
    assert [len(b["id"]) for b in batches] == [4, 4, 2]
    assert all(isinstance(b["x"], torch.Tensor) and torch.equal(b["y"], b["x"] + 1) for b in batches)
    assert torch.equal(batches[1]["x"], torch.tensor([8.0, 10, 12, 14]))
    assert it.batches == 3 and it.wait_s > 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_on_fewer_ranks_continues_the_epoch_without_skip_or_repeat(shuffle):
    kw = dict(epochs=1, shuffle=shuffle, seed=1, shuffle_window=10)
    its, positions = loaders(50, 3, 2, **kw)
    first = take([iter(x) for x in its], 4)  # 4 rounds of 3 x 2 rows
    saved = positions[0]
    assert saved.to_dict() == {"epoch": 0, "rows": 24} and all(p.to_dict() == saved.to_dict() for p in positions)
    its2, _ = loaders(50, 2, 2, position=saved, **kw)
    rest = [[b["id"].tolist() for b in it] for it in its2]
    assert sorted(flat(first) + flat(rest)) == list(range(50))
    full = [[b["id"].tolist() for b in it] for it in loaders(50, 1, 1, **kw)[0]]
    order = [i for b in full[0] for i in b]  # the epoch's global order
    assert set(flat(first)) == set(order[:24])  # what was consumed is exactly the order's prefix


def test_an_unknown_column_is_named():
    (it,), _ = loaders(10, 1, 2, columns=["id", "text"], prefetch=1)
    with pytest.raises(KeyError, match="column\\(s\\) text not in the dataset \\(it has id, x\\)"):
        next(iter(it))


def test_unlimited_epochs_keep_going():
    (it,), positions = loaders(6, 1, 4, epochs=None, prefetch=0)
    got = [b["id"].tolist() for b in itertools.islice(iter(it), 5)]
    assert got == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5], [0, 1, 2, 3]]
    assert positions[0].to_dict() == {"epoch": 2, "rows": 4}


def test_ctx_dataset_reports_data_wait_and_saves_and_restores_its_position(tmp_path, monkeypatch, capsys):
    import torch

    from raytrain.cli.progress import describe_metrics
    from raytrain.config import Options, resolve
    from raytrain.events import METRICS, parse_line
    from raytrain.runtime.context import DATA_KEY, TrainContext
    from tests.conftest import JOBS

    (tmp_path / "d.jsonl").write_text("{}\n")
    from raytrain.runtime import data_feed

    monkeypatch.setattr(data_feed, "FeedSource", lambda name: Rows(20))  # the driver's feed, without a cluster
    plan = resolve(Options(job=str(JOBS / "cnn.py"), data={"train": str(tmp_path / "d.jsonl")}, micro_batch=4))

    def make():
        return TrainContext(plan, rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))

    ctx = make()
    with pytest.raises(ValueError, match="ctx.dataset\\('eval'\\): no such dataset; --data gave: train"):
        ctx.dataset("eval")
    batches = iter(ctx.dataset("train", epochs=1))
    assert next(batches)["id"].tolist() == [0, 1, 2, 3]
    ctx.report({"step": 1, "loss": 1.0})
    metrics = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == METRICS]
    assert metrics[-1]["data_wait_s"] >= 0 and "data wait" in describe_metrics(metrics[-1])
    saved = ctx._saved_state()
    assert saved[DATA_KEY] == {"train": {"epoch": 0, "rows": 4}} and DATA_KEY not in ctx.state

    again = make()
    monkeypatch.setattr(again._checkpoints, "restore", lambda engine: (1, dict(saved)))
    again._restore()
    assert again.data_position() == {"epoch": 0, "rows": 4} and again.state == {} and again.start_step == 1
    assert [b["id"].tolist() for b in again.dataset("train", epochs=1)] == [[4, 5, 6, 7], [8, 9, 10, 11],
                                                                            [12, 13, 14, 15], [16, 17, 18, 19]]


def test_a_for_loop_is_one_epoch_and_the_next_for_continues_with_the_next():
    (it,), positions = loaders(10, 1, 4, prefetch=2)  # the default: epochs=1 per pass
    assert [b["id"].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert positions[0].to_dict() == {"epoch": 1, "rows": 0}
    assert [b["id"].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # epoch 1
    assert positions[0].to_dict() == {"epoch": 2, "rows": 0}
    (two,), _ = loaders(6, 1, 4, epochs=2, prefetch=0)
    assert [b["id"].tolist() for b in two] == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]]


def test_a_pass_restored_mid_epoch_ends_at_that_epochs_end_and_one_restored_at_its_end_runs_the_next():
    (mid,), positions = loaders(10, 1, 4, position=Position(3, 4), prefetch=1)
    assert [b["id"].tolist() for b in mid] == [[4, 5, 6, 7], [8, 9]]
    assert positions[0].to_dict() == {"epoch": 4, "rows": 0}
    (end,), positions = loaders(10, 1, 4, position=Position(3, 10), prefetch=0)
    assert [b["id"].tolist() for b in end] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # epoch 4, not an empty pass
    assert positions[0].to_dict() == {"epoch": 5, "rows": 0}
