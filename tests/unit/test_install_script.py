"""scripts/install.sh chooses torch's build honestly: the CUDA build where an NVIDIA GPU is, the CPU build
from PyTorch's CPU index (an extra index) where there is none and that index answers, else the plain pinned
install. Checked with `--dry-run` on a copy of the script (nothing installed); .ci/run runs the real install."""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import ROOT


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def cpu_index(tmp_path):
    """A stand-in for https://download.pytorch.org/whl/cpu: it answers /torch/."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl</a>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def dry_run(tmp_path, *, index: str, gpu: bool) -> list[str]:
    copy = tmp_path / "repo" / "scripts"
    copy.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", copy / "install.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable, "RAYTRAIN_TORCH_CPU_INDEX": index,
           "RAYTRAIN_NVIDIA_PROC": str(tmp_path / "no-driver")}
    proc = subprocess.run(["bash", str(copy / "install.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "repo" / ".venv").exists()  # a dry run installs nothing
    return proc.stdout.strip().splitlines()


def test_without_a_gpu_the_cpu_build_comes_from_the_cpu_index_as_an_extra_index(tmp_path, cpu_index):
    said, command = dry_run(tmp_path, index=cpu_index, gpu=False)
    assert said == f"raytrain install: torch 2.13.0, no NVIDIA GPU: the CPU build from {cpu_index}"
    assert command == f"pip install torch==2.13.0+cpu --extra-index-url {cpu_index}"


def test_without_a_gpu_and_no_cpu_index_the_plain_pinned_install_says_what_it_gets(tmp_path):
    said, command = dry_run(tmp_path, index="http://127.0.0.1:9/", gpu=False)
    assert "cannot be reached: the plain pinned install (the CUDA build from the public PyPI" in said
    assert command == "pip install torch==2.13.0"


def test_with_an_nvidia_gpu_the_cuda_build(tmp_path, cpu_index):
    said, command = dry_run(tmp_path, index=cpu_index, gpu=True)
    assert said.endswith("an NVIDIA GPU is present: the package index's torch (the CUDA build)")
    assert command == "pip install torch==2.13.0"
