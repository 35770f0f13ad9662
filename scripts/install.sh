#!/usr/bin/env bash
# Create .venv and install raytrain with its test extras. torch first, pinned: on CPU machines a CPU
# build of torch 2.13.0 is installed; an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e '.[test]'
echo "raytrain installed in .venv: $(.venv/bin/raytrain --version)"
