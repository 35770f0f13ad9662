"""Where raytrain keeps its local state (the embedded cluster's record, its auth token, default storage)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from raytrain.errors import UnsafePath


def home() -> Path:
    """``$RAYTRAIN_HOME`` or ``~/.raytrain``; created on first use with owner-only permissions."""
    path = Path(os.environ.get("RAYTRAIN_HOME") or Path.home() / ".raytrain").expanduser()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def default_storage() -> Path:
    """Default Ray Train storage for runs on the embedded local cluster."""
    return home() / "runs"


def private_dir(path: str | os.PathLike) -> Path:
    """``path`` as a folder only this user can write: created with mode 0700 when missing; an existing one
    must be a real folder (not a symlink), owned by this user and not writable by group or others. A shared
    /tmp lets anyone create ``/tmp/raytrain-UID`` first; raytrain refuses such a folder instead of using it."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise UnsafePath(
            f"{path} {problem}: another user could control what raytrain runs or reads there; remove it "
            f"(rm -rf {path}), or point RAYTRAIN_RAY_TEMP_DIR at a folder of your own"
        )
    return path
