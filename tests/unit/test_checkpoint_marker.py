"""The checkpoint marker format (raytrain.checkpoints.marker): what the workers write is what the control
plane reads (no torch, no Ray)."""
import json

import pytest

from raytrain.checkpoints import marker as markers
from raytrain.checkpoints import store
from raytrain.checkpoints.marker import Marker


def test_a_marker_round_trips_and_keeps_its_json_fields(tmp_path):
    (tmp_path / "step3").mkdir()
    (tmp_path / "step3" / "shard.pt").write_bytes(b"x" * 7)
    written = Marker(rank=1, world_size=2, step=3, tag="step3", time=12.5, metrics={"loss": 0.5},
                     files=markers.files_in(tmp_path))
    assert written.files == {"step3/shard.pt": 7}
    markers.write(tmp_path, written)
    assert markers.read(tmp_path, 1) == written
    assert json.loads((tmp_path / "raytrain_rank1.json").read_text()) == {
        "rank": 1, "world_size": 2, "step": 3, "tag": "step3", "time": 12.5, "metrics": {"loss": 0.5},
        "files": {"step3/shard.pt": 7},
    }
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, then renamed
    assert markers.has_markers(tmp_path) and markers.first_missing_file(tmp_path, written) is None


def test_missing_unreadable_and_truncated(tmp_path):
    with pytest.raises(OSError):
        markers.read(tmp_path)
    assert markers.read_or_none(tmp_path) is None and not markers.has_markers(tmp_path)
    markers.marker_path(tmp_path, 0).write_text("{not json")
    with pytest.raises(ValueError):
        markers.read(tmp_path)
    assert markers.read_or_none(tmp_path) is None
    (tmp_path / "a.bin").write_bytes(b"abc")
    m = Marker(rank=0, world_size=1, step=1, tag="step1", time=None, files={"a.bin": 4, "b.bin": 1})
    assert markers.first_missing_file(tmp_path, m) == "a.bin"


def test_what_a_rank_writes_the_store_reads_as_complete(tmp_path):
    ckpt = tmp_path / "checkpoint_x"
    for rank in range(2):
        (ckpt / "step5").mkdir(parents=True, exist_ok=True)
        (ckpt / "step5" / f"shard_{rank}.pt").write_bytes(b"y" * (rank + 1))
    for rank in range(2):
        files = {f"step5/shard_{rank}.pt": rank + 1}
        markers.write(ckpt, Marker(rank=rank, world_size=2, step=5, tag="step5", time=1.0, files=files))
    info = store.inspect(ckpt)
    assert info.complete and info.step == 5 and info.world_size == 2
    assert store.latest_complete(tmp_path).path == str(ckpt)
