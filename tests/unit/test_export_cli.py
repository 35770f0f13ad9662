"""`raytrain export`: never overwrites a file unasked, writes whole or not at all, and its wait is bounded."""
import pytest
import torch
from click.testing import CliRunner

from raytrain.cli.checkpoints import run_export
from raytrain.cli.main import main as cli
from raytrain.errors import RaytrainError
from raytrain.runtime.export.entry import save_atomically


def test_an_existing_out_file_is_refused_without_force(raytrain_home, tmp_path):
    out = tmp_path / "model.pt"
    out.write_bytes(b"the user's earlier export")
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "no-such-checkpoint"), "--out", str(out)])
    assert result.exit_code == 2
    assert "--out" in result.output and "exists" in result.output and "--force" in result.output
    assert out.read_bytes() == b"the user's earlier export"
    forced = CliRunner().invoke(cli, ["export", str(tmp_path / "no-such-checkpoint"), "--out", str(out), "--force"])
    assert "exists" not in forced.output  # --force gets past the check (to the missing checkpoint)


def test_a_failed_save_leaves_the_old_file_and_no_partial_one(tmp_path):
    out = tmp_path / "model.pt"
    out.write_bytes(b"old")
    with pytest.raises(Exception):
        save_atomically({"w": torch.zeros(2), "bad": lambda: None}, str(out))  # a lambda cannot be pickled
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
    save_atomically({"w": torch.ones(2)}, str(out))
    assert torch.equal(torch.load(out)["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_the_export_process_is_bounded(tmp_path):
    with pytest.raises(RaytrainError, match=r"did not finish within 0.01 s \(--timeout\)"):
        run_export(str(tmp_path), str(tmp_path / "model.pt"), timeout_s=0.01)
