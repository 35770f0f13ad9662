"""What a submit uploads from the job's folder: checked in the dry run, before anything is sent."""
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.errors import ConfigError
from raytrain.targets import upload
from raytrain.targets.base import SECRET_EXCLUDES

JOB = "def train(ctx):\n    pass\n"


def job_folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.py").write_text(JOB)
    return root


def dry_run(job: Path, *extra):
    return CliRunner().invoke(main, ["submit", str(job), "--workers", "1", "--dry-run", *extra])


def test_a_symlink_out_of_the_job_folder_is_refused(raytrain_home, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    folder = job_folder(tmp_path / "job")
    (folder / "data").symlink_to(secret)
    r = dry_run(folder / "job.py")
    assert r.exit_code == 2 and "data in the job's folder is a symlink to" in r.output and "outside" in r.output
    (folder / "data").unlink()
    (folder / "inside").symlink_to(folder / "job.py")  # a link inside the folder is fine
    assert dry_run(folder / "job.py").exit_code == 0


def test_home_or_raytrain_home_as_the_job_folder_is_refused(tmp_path, monkeypatch):
    home = job_folder(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAYTRAIN_HOME", str(tmp_path / "state"))
    r = dry_run(home / "job.py")
    assert r.exit_code == 2 and "is your home folder" in r.output
    folder = job_folder(tmp_path / "proj")
    monkeypatch.setenv("RAYTRAIN_HOME", str(folder / ".raytrain"))
    r = dry_run(folder / "job.py")
    assert r.exit_code == 2 and "holds RAYTRAIN_HOME" in r.output


def test_the_enclosing_repositorys_gitignore_is_honoured(raytrain_home, tmp_path):
    repo = tmp_path / "repo"
    folder = job_folder(repo / "jobs")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("*.ckpt\nscratch/\n")
    (folder / "model.ckpt").write_bytes(b"0" * 1000)
    (folder / "scratch").mkdir()
    (folder / "scratch" / "big.bin").write_bytes(b"0" * 1000)
    (folder / "keep.py").write_text("x = 1\n")
    shipped = upload.scan(folder, SECRET_EXCLUDES)
    assert "/model.ckpt" in shipped.excludes and "/scratch" in shipped.excludes
    assert shipped.files == 2  # job.py, keep.py
    r = dry_run(folder / "job.py", "--json", "--env", "RAYTRAIN_LOCAL_UPLOAD=1")
    out = json.loads(r.output)
    assert "/model.ckpt" in out["runtime_env"]["excludes"]
    assert out["upload"]["files"] == 2
    (folder / ".env").write_text("TOKEN=x\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "util.py").write_text("y = 2\n")
    (folder / "linked").symlink_to(folder / "sub")  # a link inside the folder: followed, as Ray's zip does
    copy = upload.scan(folder, SECRET_EXCLUDES).copy_to(tmp_path / "copy")  # what the local target runs from
    got = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert got == ["job.py", "keep.py", "linked/util.py", "sub/util.py"]  # no secrets, nothing ignored
    assert not (copy / "linked").is_symlink()


@pytest.mark.parametrize("rel", [
    "kubeconfig", "prod.kubeconfig", ".git-credentials", ".docker/config.json", ".gnupg/pubring.kbx",
    ".pypirc", ".npmrc", ".aws/credentials", ".config/gcloud/credentials.db", ".azure/msal_token_cache.json",
    ".cache/huggingface/token", "sub/.cache/huggingface/token", "infra/terraform.tfstate", ".kube/config",
    "id_rsa", ".env",
])
def test_credentials_are_never_uploaded(raytrain_home, tmp_path, rel):
    folder = job_folder(tmp_path / "job")
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("secret")
    shipped = upload.scan(folder, SECRET_EXCLUDES)
    assert shipped.files == 1, rel  # only job.py


def test_dry_run_shows_the_upload_and_a_too_large_one_is_refused(raytrain_home, tmp_path, monkeypatch):
    folder = job_folder(tmp_path / "job")
    (folder / "a.bin").write_bytes(b"0" * 3000)
    (folder / "b.bin").write_bytes(b"0" * 2000)
    r = dry_run(folder / "job.py")  # the local cluster: copied, not uploaded (the same checks)
    assert r.exit_code == 0 and f"job code    {folder}: 3 files, 4.9 KiB, copied to " in r.output
    r = dry_run(folder / "job.py", "--env", "RAYTRAIN_LOCAL_UPLOAD=1")
    assert r.exit_code == 0 and f"upload      {folder}: 3 files, 4.9 KiB" in r.output
    monkeypatch.setattr(upload, "UPLOAD_LIMIT_BYTES", 4000)
    monkeypatch.setattr(upload.scan, "__kwdefaults__", {"limit": 4000})
    r = dry_run(folder / "job.py")
    assert r.exit_code == 2 and "over raytrain's 3.9 KiB limit" in r.output
    assert r.output.index("a.bin (2.9 KiB)") < r.output.index("b.bin (2.0 KiB)")


def test_only_a_request_with_nothing_to_upload_skips_rays_jobs_client():
    from raytrain.targets.ray_jobs_api import nothing_to_upload

    assert nothing_to_upload({"env_vars": {"PYTHONPATH": "/copy:${PYTHONPATH}"}})  # the local target's
    assert not nothing_to_upload({"working_dir": "/jobs", "env_vars": {}})  # --address, RAYTRAIN_LOCAL_UPLOAD=1
    assert not nothing_to_upload({"py_modules": ["/src/raytrain"]})


def ray_zip_names(folder: Path, excludes: list[str], out: Path) -> set[str]:
    """What Ray's own packaging puts in the working_dir zip, given these excludes."""
    import zipfile

    from ray._private.runtime_env.packaging import _zip_files

    _zip_files(str(folder), excludes, str(out), include_gitignore=True)
    return {n.rstrip("/") for n in zipfile.ZipFile(out).namelist()}


def test_a_symlink_to_an_excluded_folder_ships_nothing_of_it(raytrain_home, tmp_path):
    folder = job_folder(tmp_path / "job")
    (folder / ".aws").mkdir()
    (folder / ".aws" / "credentials").write_text("aws_secret_access_key = x\n")
    (folder / "creds").symlink_to(folder / ".aws")  # tried: creds/credentials was uploaded
    (folder / "key-file").symlink_to(folder / ".aws" / "credentials")
    (folder / "code").mkdir()
    (folder / "code" / "util.py").write_text("x = 1\n")
    (folder / "lib").symlink_to(folder / "code")  # a link to a folder that ships: still followed
    shipped = upload.scan(folder, SECRET_EXCLUDES)
    assert sorted(shipped.paths) == ["code/util.py", "job.py", "lib/util.py"], shipped.paths
    assert {"/creds", "/key-file"} <= set(shipped.excludes)
    names = ray_zip_names(folder, shipped.excludes, tmp_path / "wd.zip")
    assert not any("credentials" in n or n.startswith(("creds", "key-file")) for n in names), names
    assert "lib/util.py" in names
    # the local cluster's copy (instead of an upload) holds the same
    copied = shipped.copy_to(tmp_path / "copy")
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == sorted(shipped.paths)


def test_a_link_into_a_git_ignored_file_is_excluded_by_its_target(raytrain_home, tmp_path):
    repo = tmp_path / "repo"
    folder = job_folder(repo / "jobs")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/jobs/private/\n")
    (folder / "private").mkdir()
    (folder / "private" / "notes.txt").write_text("secret\n")
    (folder / "view").symlink_to(folder / "private")
    shipped = upload.scan(folder, SECRET_EXCLUDES)
    assert not any("notes" in p for p in shipped.paths), shipped.paths


def test_a_failing_git_is_said_and_refused_not_taken_as_nothing_ignored(raytrain_home, tmp_path):
    repo = tmp_path / "repo"
    folder = job_folder(repo / "jobs")
    (repo / ".git").write_text(f"gitdir: {tmp_path / 'gone'}\n")  # a worktree whose repository is gone
    with pytest.raises(ConfigError, match=r"git repository .*`git ls-files` failed .*not a git repository"):
        upload.scan(folder, SECRET_EXCLUDES)
    r = dry_run(folder / "job.py")
    assert r.exit_code == 2 and "git ls-files" in r.output and "outside the repository" in r.output, r.output
    # outside any repository nothing needs git
    plain = job_folder(tmp_path / "plain")
    assert upload.scan(plain, SECRET_EXCLUDES).paths == ["job.py"]


def test_a_git_that_hangs_is_bounded_and_refused(raytrain_home, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    folder = job_folder(repo / "jobs")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text("#!/bin/sh\nsleep 30\n")  # a git stuck on a network file system
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(upload, "GIT_TIMEOUT_S", 0.5)
    with pytest.raises(ConfigError, match=r"took over 0.5 s"):
        upload.scan(folder, SECRET_EXCLUDES)
