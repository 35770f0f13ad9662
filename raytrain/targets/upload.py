"""What a submit uploads from the job's folder (Ray's ``working_dir``), checked before anything is sent.

Ray zips the folder with ``excludes`` and the folder's own ``.gitignore`` files and follows symlinks. Here:
the folder may not be ``$HOME`` or hold ``RAYTRAIN_HOME``; a symlink may not point outside it, and one that
points at an excluded file or folder is excluded too; the enclosing git repository's ignore rules (``git
ls-files --ignored``) are added to the excludes (a git that fails there is refused, not taken as "nothing
ignored"); credentials are never shipped (SECRET_EXCLUDES); and the upload's file count and size are known (``--dry-run`` shows them) and
capped at UPLOAD_LIMIT_BYTES, the largest files named when over.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from raytrain import paths
from raytrain.errors import ConfigError

UPLOAD_LIMIT_BYTES = 100 * 2**20  # Ray's upload of a working_dir fails or crawls well before its 512 MiB cap
GIT_TIMEOUT_S = 20.0


@dataclass
class Upload:
    """The files a submit ships from ``root`` and the excludes (gitignore-style) that leave the rest."""

    root: str
    excludes: list[str]
    files: int = 0
    bytes: int = 0
    largest: list[tuple[int, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # every shipped file, relative to root

    def copy_to(self, dest: str | Path) -> Path:
        """Copy the shipped files (symlinks inside the folder followed, as Ray's zip does) to ``dest``."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=False, mode=0o700)
        for rel in self.paths:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(self.root) / rel, target)
        return dest

    def summary(self) -> dict:
        return {"folder": self.root, "files": self.files, "bytes": self.bytes, "size": human(self.bytes)}


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _matches(rel: str, patterns: list[str]) -> bool:
    """gitignore-style, as far as SECRET_EXCLUDES and ``git ls-files`` output need: ``/a/b`` anchored,
    ``**/a/b`` or a slash-less ``name`` at any depth, ``a/b`` anchored."""
    parts = rel.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if pattern.startswith("/") or ("/" in pattern and not pattern.startswith("**/")):
            anchored = pattern.lstrip("/").split("/")
            if len(parts) >= len(anchored) and all(fnmatch.fnmatch(p, a) for p, a in zip(parts, anchored)):
                return True
            continue
        tail = pattern[3:].split("/") if pattern.startswith("**/") else [pattern]
        for i in range(len(parts) - len(tail) + 1):
            if all(fnmatch.fnmatch(p, t) for p, t in zip(parts[i:], tail)):
                return True
    return False


def in_repository(folder: Path) -> Path | None:
    """The nearest folder at or above ``folder`` that holds a ``.git`` (a git repository's top), if any."""
    for candidate in [folder, *folder.parents]:
        if (candidate / ".git").exists():
            return candidate
    return None


def git_ignored(folder: Path) -> list[str]:
    """Anchored excludes for what the enclosing git repository ignores under ``folder`` (its .gitignore
    files above the folder too, .git/info/exclude, the user's excludesFile); [] outside a repository.
    Inside one, a git that is missing, fails or times out is refused (ConfigError): its ignore rules would
    otherwise be silently empty and ignored files (secrets among them) shipped."""
    repo = in_repository(folder)
    if repo is None:
        return []
    what = None
    git = shutil.which("git")
    if git is None:
        what = "git is not installed"
    else:
        try:
            proc = subprocess.run(
                [git, "-C", str(folder), "ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                 "--directory"],
                capture_output=True, timeout=GIT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            what = f"`git ls-files` took over {GIT_TIMEOUT_S:g} s"
        except OSError as exc:
            what = f"git cannot run ({exc})"
        else:
            if proc.returncode != 0:
                last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
                what = f"`git ls-files` failed ({last})"
    if what is not None:
        raise ConfigError(
            f"the job's folder {folder} is in the git repository {repo}, but {what}: raytrain cannot read what "
            "its .gitignore files leave out, and will not upload ignored files. Fix git there, or put the job "
            "in a folder outside the repository", flag="JOB",
        )
    return ["/" + p.rstrip("/") for p in proc.stdout.decode(errors="replace").split("\0") if p]


def check_folder(folder: Path) -> None:
    """Refuse uploading the home folder, or a folder holding raytrain's own state (its auth token)."""
    folder = folder.resolve()
    if folder == Path.home().resolve():
        raise ConfigError(
            f"the job file's folder is your home folder ({folder}), which would be uploaded to the cluster "
            "whole: put the job in a folder of its own", flag="JOB",
        )
    state = paths.home().resolve()
    if state == folder or folder in state.parents:
        raise ConfigError(
            f"the job file's folder {folder} holds RAYTRAIN_HOME ({state}, with the cluster's auth token), "
            "which would be uploaded with it: put the job in a folder of its own", flag="JOB",
        )


def scan(folder: str | Path, excludes: list[str], *, limit: int = UPLOAD_LIMIT_BYTES) -> Upload:
    """What Ray would upload: refuses symlinks out of the folder and an upload over ``limit``."""
    root = Path(folder).resolve()
    check_folder(root)
    upload = Upload(str(root), list(excludes) + git_ignored(root))
    sizes: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        for name in list(dirnames) + filenames:
            rel = rel_dir + name
            full = Path(dirpath) / name
            if _matches(rel, upload.excludes):
                if name in dirnames:
                    dirnames.remove(name)
                continue
            if full.is_symlink():
                _check_link(root, full, rel)
                # Ray follows the link and matches excludes against the link's path, not its target's: a link to
                # an excluded folder (creds -> .aws) would ship it. Excluded by where it points, too.
                if _matches(os.path.relpath(full.resolve(), root), upload.excludes):
                    upload.excludes.append("/" + rel)
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                if full.is_dir():  # Ray follows it: so does the count, inside the folder
                    for p in full.rglob("*"):
                        if not p.is_file():
                            continue
                        inner = f"{rel}/{p.relative_to(full).as_posix()}"
                        if _matches(inner, upload.excludes) or _matches(os.path.relpath(p.resolve(), root),
                                                                        upload.excludes):
                            upload.excludes.append("/" + inner)
                            continue
                        sizes.append((p.stat().st_size, inner))
                    continue
            if name in filenames and full.is_file():
                sizes.append((full.stat().st_size, rel))
    upload.files = len(sizes)
    upload.bytes = sum(s for s, _ in sizes)
    upload.largest = sorted(sizes, reverse=True)[:5]
    upload.paths = [rel for _, rel in sizes]
    if upload.bytes > limit:
        top = ", ".join(f"{rel} ({human(s)})" for s, rel in upload.largest)
        raise ConfigError(
            f"the job's folder {root} would upload {upload.files} files, {human(upload.bytes)}: over raytrain's "
            f"{human(limit)} limit. Largest: {top}. Put data and checkpoints on --storage or in .gitignore",
            flag="JOB",
        )
    return upload


def _check_link(root: Path, link: Path, rel: str) -> None:
    target = link.resolve()
    if target != root and root not in target.parents:
        raise ConfigError(
            f"{rel} in the job's folder is a symlink to {os.readlink(link)}, outside the folder: Ray would "
            "upload what it points to. Remove it, or add it to .gitignore", flag="JOB",
        )
