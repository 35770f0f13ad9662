"""Shared /tmp: raytrain's temp folders must be this user's own (owner, mode, no symlink) before use."""
import os
import stat
import tempfile

import pytest

from raytrain import paths
from raytrain.clusters import ray_process
from raytrain.errors import UnsafePath
from raytrain.runtime.checkpoint import files as checkpoint


def _foreign(path, monkeypatch):
    """Make ``path`` owned by another user: chown as root, else report another uid from os.lstat."""
    if os.getuid() == 0:
        os.chown(path, 65534, 65534)
        return
    real = os.lstat

    def lstat(p, *a, **k):
        info = real(p, *a, **k)
        if os.path.abspath(p) != os.path.abspath(path):
            return info
        fields = list(info)
        fields[stat.ST_UID] = os.getuid() + 1
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat)


def test_private_dir_created_owner_only(tmp_path):
    made = paths.private_dir(tmp_path / "a" / "b")
    assert made.is_dir() and stat.S_IMODE(os.lstat(made).st_mode) == 0o700
    assert paths.private_dir(made) == made  # an existing own folder is accepted


def test_private_dir_refuses_symlink_and_shared_modes(tmp_path):
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(own)
    with pytest.raises(UnsafePath, match="symbolic link"):
        paths.private_dir(link)
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(UnsafePath, match="not a folder"):
        paths.private_dir(afile)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_an_own_folder_others_can_write_is_tightened_unless_it_holds_their_files(tmp_path, monkeypatch, mode):
    wide = tmp_path / "wide"
    (wide / "session_1").mkdir(parents=True)
    (wide / "session_1" / "log.txt").write_text("ours")
    os.chmod(wide, mode)
    assert paths.private_dir(wide) == wide and stat.S_IMODE(os.lstat(wide).st_mode) == 0o700
    os.chmod(wide, mode)
    planted = wide / "session_1" / "planted"
    planted.write_text("theirs")
    _foreign(planted, monkeypatch)
    with pytest.raises(UnsafePath, match="written by other users.*planted"):
        paths.private_dir(wide)
    assert stat.S_IMODE(os.lstat(wide).st_mode) == mode  # left as it was


def test_foreign_ray_temp_dir_refused(tmp_path, monkeypatch):
    foreign = tmp_path / "raytrain-1000"
    foreign.mkdir(mode=0o700)
    _foreign(foreign, monkeypatch)
    monkeypatch.setenv("RAYTRAIN_RAY_TEMP_DIR", str(foreign))
    with pytest.raises(UnsafePath, match="belongs to uid"):
        ray_process.prepare_temp_dir()


def test_universal_folder_is_private_and_owner_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = checkpoint.universal_root()
    assert root == tmp_path / f"raytrain-universal-{os.getuid()}"
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    # a folder planted under the predictable name by someone else (done-marker and all) is refused
    os.rmdir(root)
    root.mkdir(mode=0o700)
    (root / "x").mkdir()
    (root / "x" / ".raytrain-done").write_text("1")
    _foreign(root, monkeypatch)
    with pytest.raises(UnsafePath, match="belongs to uid"):
        checkpoint.universal_root()


def test_ray_gets_a_subfolder_of_the_checked_one(tmp_path, monkeypatch):
    """Ray chmods the temp dir it is given to 0777: it gets a subfolder, the checked parent stays 0700."""
    base = tmp_path / "rt"
    monkeypatch.setenv("RAYTRAIN_RAY_TEMP_DIR", str(base))
    ray_dir = ray_process.prepare_temp_dir()
    assert ray_dir.parent == base and stat.S_IMODE(os.lstat(base).st_mode) == 0o700
    os.chmod(ray_dir, 0o777)  # what `ray start` does to it
    assert ray_process.prepare_temp_dir() == ray_dir  # the next `cluster up` still accepts it
