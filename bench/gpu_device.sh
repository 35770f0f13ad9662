#!/usr/bin/env bash
# The GPU device check, one command: bench/gpu_mfu.py (bf16 eager and torch.compile, then fp16 with dynamic
# loss scaling) on one GPU, with raytrain's NVML sampler reading the device meanwhile. The GPU image has torch
# but not what DeepSpeed needs: wheels in .whl/ (see README, Benchmarks) are installed to /tmp/site first.
#   bash bench/gpu_device.sh [gpu_mfu.py options]      # results in $OUT (the device tool) or bench/results
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_device: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/nvidia_smi.txt"
python3 -c 'import torch, deepspeed; print("torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__)' 2>&1 | tail -1
PYTHONUNBUFFERED=1 python3 bench/gpu_mfu.py --out "$out/gpu_mfu.json" "$@" 2>&1 | tee "$out/gpu_mfu.log"
