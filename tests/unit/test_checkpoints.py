"""Checkpoint completeness and resume resolution on real directories (no torch, no Ray)."""
import json

import pytest

from raytrain.checkpoints import store
from raytrain.errors import ConfigError


def make_checkpoint(run_dir, name, step, world=2, sizes=(10, 20)):
    d = run_dir / name
    (d / f"step{step}").mkdir(parents=True)
    for rank in range(world):
        shard = d / f"step{step}" / f"shard_{rank}.pt"
        shard.write_bytes(b"x" * sizes[rank])
        marker = {"rank": rank, "world_size": world, "step": step, "tag": f"step{step}", "time": 1.0 + step,
                  "metrics": {"loss": 1.0 / step}, "files": {f"step{step}/shard_{rank}.pt": sizes[rank]}}
        (d / f"raytrain_rank{rank}.json").write_text(json.dumps(marker))
    return d


def test_complete_checkpoint(tmp_path):
    d = make_checkpoint(tmp_path, "checkpoint_a", 4)
    info = store.inspect(d)
    assert info.complete and info.step == 4 and info.world_size == 2 and info.size_bytes > 30
    assert info.metrics == {"loss": 0.25}


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: (d / "raytrain_rank1.json").unlink(), "rank 1 marker missing"),
        (lambda d: (d / "raytrain_rank0.json").unlink(), "rank 0 marker missing"),
        (lambda d: (d / "step8" / "shard_1.pt").write_bytes(b"x" * 3), "rank 1 file step8/shard_1.pt"),
        (lambda d: (d / "step8" / "shard_0.pt").unlink(), "rank 0 file step8/shard_0.pt"),
    ],
)
def test_interrupted_checkpoint_is_never_picked(tmp_path, damage, reason):
    make_checkpoint(tmp_path, "checkpoint_a", 4)
    newer = make_checkpoint(tmp_path, "checkpoint_b", 8)
    damage(newer)
    info = store.inspect(newer)
    assert not info.complete and reason in info.reason
    assert store.latest_complete(tmp_path).step == 4
    assert store.resolve_resume(str(tmp_path), None).step == 4
    with pytest.raises(ConfigError, match="incomplete"):
        store.resolve_resume(str(newer), None)


def test_resume_by_run_name_under_storage(tmp_path):
    run = tmp_path / "raytrain-gpt-1"
    make_checkpoint(run, "checkpoint_a", 4)
    make_checkpoint(run, "checkpoint_b", 12)
    assert store.resolve_resume("raytrain-gpt-1", str(tmp_path)).step == 12
    assert [c.step for c in store.list_checkpoints(run)] == [4, 12]


def test_resume_errors_name_what_was_tried(tmp_path):
    with pytest.raises(ConfigError, match="--resume nope: no such run or checkpoint"):
        store.resolve_resume("nope", str(tmp_path))
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(ConfigError, match="has no complete checkpoint"):
        store.resolve_resume("empty-run", str(tmp_path))


def test_remove_uncommitted_deletes_every_interrupted_save_and_keeps_the_committed_ones(tmp_path):
    run = tmp_path / "run"
    kept = [make_checkpoint(run, "checkpoint_a", 4), make_checkpoint(run, "checkpoint_c", 12)]
    rank1_died = make_checkpoint(run, "checkpoint_b", 8)
    (rank1_died / "raytrain_rank1.json").unlink()
    truncated = make_checkpoint(run, "checkpoint_d", 16)
    (truncated / "step16" / "shard_0.pt").write_bytes(b"x")
    no_marker = run / "checkpoint_e"  # Ray Train made the folder, no rank wrote its marker
    (no_marker / "step20").mkdir(parents=True)
    (run / "checkpoint_manager_snapshot.json").write_text("{}")  # not a checkpoint: never touched
    removed = store.remove_uncommitted(run)
    assert sorted((c.path, c.step, c.reason) for c in removed) == [
        (str(rank1_died), 8, "rank 1 marker missing"),
        (str(truncated), 16, "rank 0 file step16/shard_0.pt missing or truncated"),
        (str(no_marker), None, "rank 0 marker missing"),
    ]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_a", "checkpoint_c", "checkpoint_manager_snapshot.json"]
    assert [c.step for c in store.list_checkpoints(run)] == [4, 12] and all(p.is_dir() for p in kept)
    assert store.remove_uncommitted(run) == [] and store.remove_uncommitted(tmp_path / "no-such-run") == []


def test_a_file_removed_while_a_checkpoint_is_inspected_makes_it_uncommitted_not_an_error(tmp_path, monkeypatch):
    """Another rank may be removing an uncommitted checkpoint while this one looks for its restore point."""
    from pathlib import Path

    d = make_checkpoint(tmp_path, "checkpoint_a", 4)
    real_stat = Path.stat

    def vanishing(self, *a, **kw):
        if self.name == "shard_1.pt":
            raise FileNotFoundError(self)
        return real_stat(self, *a, **kw)

    monkeypatch.setattr(Path, "stat", vanishing)
    info = store.inspect(d)
    assert not info.complete and info.reason == "rank 1 file step4/shard_1.pt missing or truncated"
