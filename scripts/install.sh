#!/usr/bin/env bash
# Create .venv and install raytrain with its test extras. torch first, pinned (torch==2.13.0):
# - on a machine with an NVIDIA GPU (nvidia-smi on PATH or /proc/driver/nvidia): the package index's torch,
#   which is the CUDA build (multi-GB, with its nvidia-* wheels);
# - without one: the CPU build from PyTorch's CPU wheel index (RAYTRAIN_TORCH_CPU_INDEX, default
#   https://download.pytorch.org/whl/cpu), given as an extra index, when that index answers within 5 s;
#   if it does not (no route, a proxy-only network), the plain pinned install: whatever your package index
#   serves first, which is the CUDA build from the public PyPI and a CPU build only where a local CPU wheel
#   is served first (a wheelhouse in pip's find-links).
# The last line says which build was installed. `scripts/install.sh --dry-run` prints the choice and the pip
# command, and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
CPU_INDEX=${RAYTRAIN_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
NVIDIA_PROC=${RAYTRAIN_NVIDIA_PROC:-/proc/driver/nvidia}  # overridable for tests
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1

has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 || [ -e "$NVIDIA_PROC" ]; }

reachable() {  # the index answers HTTP within 5 s
  "$PYTHON" - "$1" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
PY
}

if has_nvidia_gpu; then
  why="an NVIDIA GPU is present: the package index's torch (the CUDA build)"
  torch_args=("torch==$TORCH_VERSION")
elif reachable "$CPU_INDEX"; then
  why="no NVIDIA GPU: the CPU build from $CPU_INDEX"
  torch_args=("torch==$TORCH_VERSION+cpu" --extra-index-url "$CPU_INDEX")
else
  why="no NVIDIA GPU, and $CPU_INDEX cannot be reached: the plain pinned install (the CUDA build from the public PyPI; a CPU build only where a local CPU wheel is served first)"
  torch_args=("torch==$TORCH_VERSION")
fi
echo "raytrain install: torch $TORCH_VERSION, $why"
if [ "$DRY_RUN" = 1 ]; then
  echo "pip install ${torch_args[*]}"
  exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -m pip install -q "${torch_args[@]}"; then
  [ "${torch_args[0]}" = "torch==$TORCH_VERSION" ] && exit 1
  echo "raytrain install: the CPU build failed to install from $CPU_INDEX; falling back to torch==$TORCH_VERSION" >&2
  .venv/bin/python -m pip install -q "torch==$TORCH_VERSION"
fi
# setuptools warns on every editable install of a flat layout that a folder named like the package in the
# working directory may shadow it: here that folder is the package itself
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e '.[test]'
build=$(.venv/bin/python -c 'import torch; print(torch.__version__, "(CUDA build, CUDA " + torch.version.cuda + ")" if torch.version.cuda else "(CPU build)")' 2>/dev/null)
echo "raytrain installed in .venv: $(.venv/bin/raytrain --version); torch $build"
