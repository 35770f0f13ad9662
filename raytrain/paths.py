"""Where raytrain keeps its local state (the embedded cluster's record, its auth token, default storage)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from raytrain import settings
from raytrain.errors import UnsafePath


def home() -> Path:
    """``$RAYTRAIN_HOME`` or ``~/.raytrain``; created on first use with owner-only permissions, and checked as
    the temp folders are (:func:`private_dir`): it holds the local cluster's auth token and the job-code copies
    the driver runs from and deletes."""
    path = Path(settings.get("RAYTRAIN_HOME") or Path.home() / ".raytrain").expanduser()
    return private_dir(path, variable="RAYTRAIN_HOME")


def default_storage() -> Path:
    """Default Ray Train storage for runs on the embedded local cluster."""
    return home() / "runs"


def job_code_root() -> Path:
    """Where jobs on the local cluster run from: a copy of each job's folder (targets/local.py), removed by
    the job's driver when it ends and all at once by ``cluster down``."""
    return home() / "job-code"


def _foreign_entry(root: Path) -> tuple[str, int] | None:
    """The first file or folder under ``root`` (symlinks not followed) that another user owns, if any."""
    me = os.getuid()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            entry = os.path.join(folder, name)
            try:
                owner = os.lstat(entry).st_uid
            except OSError:
                continue
            if owner != me:
                return entry, owner
    return None


def private_dir(path: str | os.PathLike, *, variable: str = "RAYTRAIN_RAY_TEMP_DIR") -> Path:
    """``path`` as a folder only this user can write: created with mode 0700 when missing; an existing one
    must be a real folder (not a symlink) owned by this user; one that group or others can write is made 0700
    if nothing in it belongs to another user. A shared /tmp lets anyone create ``/tmp/raytrain-UID`` first;
    raytrain refuses such a folder instead of using it."""
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
        # Ours but open (an older raytrain let Ray make it 0777): tighten it, unless someone else already
        # put something in it.
        foreign = _foreign_entry(path)
        if foreign is None:
            os.chmod(path, 0o700)
        else:
            problem = (f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o}) and holds "
                       f"{foreign[0]}, which belongs to uid {foreign[1]}")
    if problem:
        raise UnsafePath(
            f"{path} {problem}: another user could control what raytrain runs or reads there; remove it "
            f"(rm -rf {path}), or point {variable} at a folder of your own"
        )
    return path


# A run's record (events, rank logs) and its trackers' files on a shared --storage hold the job's whole output:
# only the job's user may read them. These two create them so, whatever the umask.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_mkdir(path: str | os.PathLike) -> Path:
    """``path`` as a folder: missing folders (``path`` and its missing parents) are created 0700; ``path``
    itself, when it is ours, is made 0700 (a record folder an older raytrain made with the umask's mode)."""
    path = Path(path)
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, PRIVATE_DIR_MODE)  # mkdir's mode went through the umask
    _make_private(path, PRIVATE_DIR_MODE)
    return path


def _make_private(target: str | os.PathLike | int, mode: int) -> None:
    """``target`` (a path, or an open file descriptor) made ``mode`` where it is ours and not so already; a
    file system that refuses leaves it as it is."""
    try:
        info = os.stat(target)
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != mode:
            os.chmod(target, mode)
    except OSError:
        pass


def private_open(path: str | os.PathLike, mode: str = "a", **kwargs):
    """``open(path, mode)`` ("a", "w", "ab", "wb") for a file only its owner may read: created 0600; an
    existing file of ours is made 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    _make_private(fd, PRIVATE_FILE_MODE)
    return os.fdopen(fd, mode, **kwargs)


def private_write(path: str | os.PathLike, text: str) -> None:
    """Replace ``path``'s content with ``text`` at once (a temporary file of mode 0600, renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with private_open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
