"""ctx.dataset's split (raytrain.runtime.datasets.batches) without Ray: an in-memory BlockSource stands in for the Feeder's
blocks in the object store (the same rows in the same blocks, in order); it counts the blocks each rank
fetched."""
import itertools

import numpy as np
import pytest

from raytrain.runtime.datasets.batches import Position, Seq, ShardBatches, piece_rows, rechunk
from raytrain.runtime.datasets.feed import BlockSource


class Rows(BlockSource):
    """The rows 0..n-1 in blocks of ``block`` rows, all produced at once (or ``per_call`` blocks per ask)."""

    def __init__(self, n, block=7, per_call=None):
        super().__init__()
        self.n, self.block, self.per_call = n, block, per_call
        self.pending = [(s, min(s + block, n)) for s in range(0, n, block)]
        self.fetched = []

    def _more(self):
        take = self.pending[: self.per_call or len(self.pending)]
        self.pending = self.pending[len(take):]
        self._add([((a, b), 0, None, b - a) for a, b in take])
        self.done = not self.pending

    def _fetch(self, entry):
        (a, b), _, _, _ = entry
        self.fetched.append(a // self.block)
        ids = np.arange(a, b)
        return {"id": ids, "x": ids.astype(np.float32) * 2}, 16 * (b - a)


def loaders(n, size, batch, position=None, block=7, **kw):
    position = position or Position()
    positions = [Position(**position.to_dict()) for _ in range(size)]
    return [ShardBatches(Rows(n, block), rank=r, size=size, batch_size=batch, position=positions[r], **kw)
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


def test_rechunk_keeps_every_row_in_order():
    batches = [{"a": np.arange(s, s + 5)} for s in range(0, 23, 5)]
    out = list(rechunk(iter(batches), 4))
    assert [len(b["a"]) for b in out] == [4, 4, 4, 4, 4, 4, 1]
    assert np.concatenate([b["a"] for b in out]).tolist() == list(range(25))


def test_seq_slices_ranges_open_ends_and_index_arrays():
    seq = Seq([(10, 14), np.array([3, 1]), (20, None)])
    assert seq.slice(2, 7).to_list() == [[12, 14], [3, 1], [20, 21]]
    assert seq.slice(5, None).to_list() == [[1], [20, None]]
    assert seq.length(None) is None and seq.length(25) == 11 and Seq([(0, 4)]).length(None) == 4
    assert seq.slice(0, 6).indices(np.array([5, 0, 4])).tolist() == [1, 10, 3]
    assert piece_rows(7, 4) == 56 and piece_rows(100, 3) == 801 and piece_rows(1, 8) == 8


def test_the_last_rows_are_split_evenly_or_dropped_by_all():
    # 29 rows, 3 ranks, batches of 4, pieces of 56 (> the dataset): chunks of 8 rows, then 5 rows split 2/2/1 ...
    its, _ = loaders(29, 3, 4, block=7)
    got = [[b["id"].tolist() for b in it] for it in its]
    assert [[len(b) for b in r] for r in got] == [[4, 4, 1], [4, 4, 2], [4, 4, 2]]
    assert flat(got) == list(range(29))
    # ... and 26 rows: chunks of 8 rows, 2 left for 3 ranks: dropped by every rank
    its, _ = loaders(26, 3, 4, block=7)
    got = [[b["id"].tolist() for b in it] for it in its]
    assert [[len(b) for b in r] for r in got] == [[4, 4]] * 3 and flat(got) == list(range(24))


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_are_disjoint_and_cover_each_epoch_exactly_once(shuffle):
    its, positions = loaders(40, 2, 4, epochs=2, shuffle=shuffle, seed=3, shuffle_window=16, prefetch=2, block=3)
    iterators = [iter(x) for x in its]
    epoch0 = take(iterators, 5)
    assert flat(epoch0) == list(range(40))
    assert not set(sum(epoch0[0], [])) & set(sum(epoch0[1], []))
    assert positions[0].to_dict()["epoch"] == 0 and positions[0].rows == 40
    epoch1 = take(iterators, 5)
    assert flat(epoch1) == list(range(40))
    assert (epoch0 != epoch1) == shuffle  # a new order each epoch when shuffled
    assert all(next(it, None) is None for it in iterators)  # epochs=2: done
    assert positions[1].to_dict() == {"epoch": 2, "rows": 0, "phases": []}
    again = [iter(x) for x in loaders(40, 2, 4, epochs=1, shuffle=shuffle, seed=3, shuffle_window=16, block=3)[0]]
    assert take(again, 5) == epoch0  # deterministic for a seed


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("block,share", [(20, 0.52), (21, 0.58)])  # pieces aligned to blocks (160 rows) or not
def test_each_rank_fetches_only_about_its_share_of_the_blocks(shuffle, block, share):
    # 2,000 rows in blocks of 20 (or 21); batches of 10; pieces of 8 blocks (rounded to whole batches)
    its, _ = loaders(2000, 2, 10, shuffle=shuffle, seed=5, shuffle_window=50, block=block)
    got = [[b["id"].tolist() for b in it] for it in its]
    assert flat(got) == list(range(2000)) and len(got[0]) == len(got[1]) == 100
    for it in its:
        fetched = it.source.fetched
        assert it.source.bytes_read <= share * 16 * 2000, (len(set(fetched)), fetched)
        assert len(fetched) == len(set(fetched))  # no block fetched twice in an epoch (the cache holds it)


def test_a_streaming_dataset_is_read_as_its_blocks_arrive():
    source = Rows(100, block=10, per_call=1)  # one more block each time the rank asks
    (it,) = [ShardBatches(source, rank=0, size=1, batch_size=5, position=Position())]
    first = next(iter(it))
    assert first["id"].tolist() == [0, 1, 2, 3, 4] and len(source.table) < 10  # not the whole dataset first


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
@pytest.mark.parametrize("rows,before,after,batch,steps", [(50, 3, 2, 2, 4), (300, 2, 3, 4, 13), (300, 2, 1, 4, 30),
                                                         (300, 3, 2, 3, 7)])
def test_a_resume_on_another_number_of_ranks_continues_the_epoch_without_skip_or_repeat(
        shuffle, rows, before, after, batch, steps):
    kw = dict(epochs=1, shuffle=shuffle, seed=1, shuffle_window=10, block=6)
    its, positions = loaders(rows, before, batch, **kw)
    first = take([iter(x) for x in its], steps)
    saved = positions[0]
    assert saved.rows == before * batch * steps and all(p.to_dict() == saved.to_dict() for p in positions)
    its2, positions2 = loaders(rows, after, batch, position=saved, **kw)
    rest = [[b["id"].tolist() for b in it] for it in its2]
    assert len({len(r) for r in rest}) == 1  # the same number of steps on every rank
    dropped = set(range(rows)) - set(flat(first) + flat(rest))
    assert sorted(flat(first) + flat(rest)) == sorted(set(range(rows)) - dropped) and len(dropped) < after
    assert positions2[0].epoch == 1
    # and again, resized back mid-way through the second phase: a third phase, still exact
    its3, pos3 = loaders(rows, after, batch, position=saved, **kw)
    second = take([iter(x) for x in its3], 2)
    its4, _ = loaders(rows, before, batch, position=pos3[0], **kw)
    third = [[b["id"].tolist() for b in it] for it in its4]
    assert len(pos3[0].phases) == 2
    ids = flat(first) + flat(second) + flat(third)
    assert len(ids) == len(set(ids)) and len(set(range(rows)) - set(ids)) < before


def test_a_resume_on_the_same_ranks_gives_each_rank_the_same_batches_as_without_it():
    kw = dict(epochs=1, shuffle=True, seed=4, shuffle_window=7, block=5)
    whole = [[b["id"].tolist() for b in it] for it in loaders(200, 2, 4, **kw)[0]]
    its, positions = loaders(200, 2, 4, **kw)
    first = take([iter(x) for x in its], 9)
    rest = [[b["id"].tolist() for b in it] for it in loaders(200, 2, 4, position=positions[0], **kw)[0]]
    assert [f + r for f, r in zip(first, rest)] == whole


def test_an_unknown_column_is_named():
    (it,), _ = loaders(10, 1, 2, columns=["id", "text"], prefetch=1)
    with pytest.raises(KeyError, match="column\\(s\\) text not in the dataset \\(it has id, x\\)"):
        next(iter(it))


def test_unlimited_epochs_keep_going():
    (it,), positions = loaders(6, 1, 4, epochs=None, prefetch=0)
    got = [b["id"].tolist() for b in itertools.islice(iter(it), 5)]
    assert got == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5], [0, 1, 2, 3]]
    assert positions[0].epoch == 2 and positions[0].rows == 4


def test_ctx_dataset_reports_data_wait_and_saves_and_restores_its_position(tmp_path, monkeypatch, capsys):
    import torch

    from raytrain.cli.progress import describe_metrics
    from raytrain.config import Options, resolve
    from raytrain.events import METRICS, parse_line
    from raytrain.runtime.worker.context import DATA_KEY, TrainContext
    from tests.conftest import JOBS

    (tmp_path / "d.jsonl").write_text("{}\n")
    from raytrain.runtime.datasets import feed as data_feed

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
    phases = [{"n": 1, "bs": 4, "C": 56, "u": 4}]
    assert saved[DATA_KEY] == {"train": {"epoch": 0, "rows": 4, "phases": phases}} and DATA_KEY not in ctx.state

    again = make()
    monkeypatch.setattr(again._checkpoints, "restore", lambda engine: (1, dict(saved)))
    again._restore()
    assert again.data_position() == {"epoch": 0, "rows": 4, "phases": phases}
    assert again.state == {} and again.start_step == 1
    assert [b["id"].tolist() for b in again.dataset("train", epochs=1)] == [[4, 5, 6, 7], [8, 9, 10, 11],
                                                                            [12, 13, 14, 15], [16, 17, 18, 19]]


def test_a_for_loop_is_one_epoch_and_the_next_for_continues_with_the_next():
    (it,), positions = loaders(10, 1, 4, prefetch=2)  # the default: epochs=1 per pass
    assert [b["id"].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (positions[0].epoch, positions[0].rows) == (1, 0)
    assert [b["id"].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # epoch 1
    assert (positions[0].epoch, positions[0].rows) == (2, 0)
    (two,), _ = loaders(6, 1, 4, epochs=2, prefetch=0)
    assert [b["id"].tolist() for b in two] == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]]


def test_a_pass_restored_mid_epoch_ends_at_that_epochs_end_and_one_restored_at_its_end_runs_the_next():
    (mid,), positions = loaders(10, 1, 4, position=Position(3, 4), prefetch=1)  # as saved before phases existed
    assert [b["id"].tolist() for b in mid] == [[4, 5, 6, 7], [8, 9]]
    assert (positions[0].epoch, positions[0].rows) == (4, 0)
    (end,), positions = loaders(10, 1, 4, position=Position(3, 10), prefetch=0)
    assert [b["id"].tolist() for b in end] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # epoch 4, not an empty pass
    assert (positions[0].epoch, positions[0].rows) == (5, 0)
    done = Position(3, 10, [{"n": 1, "bs": 4, "C": 56, "u": 10}])  # as saved after the epoch's last batch
    (end,), positions = loaders(10, 1, 4, position=done, prefetch=0)
    assert [b["id"].tolist() for b in end] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (positions[0].epoch, positions[0].rows) == (5, 0)
