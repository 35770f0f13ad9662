#!/usr/bin/env bash
# The GPU device check, one command, on one GPU with raytrain's NVML sampler reading the device meanwhile:
#   1. bench/gpu_mfu.py: bf16 eager (with a kernel profile), torch.compile, then fp16 with dynamic loss scaling;
#   2. eager bf16 at micro-batch 32 and 64 (MFU against the GEMMs' size; the planner at large activations);
#   3. the planner against other layouts: ZeRO-1, ZeRO-3, and gradients accumulated over 4 micro-batches.
# The GPU image has torch but not what DeepSpeed needs: wheels in .whl/ (see docs/benchmarks.md) are installed
# to /tmp/site first. Results: one JSON per run and one log (the device tool returns at most 8 files).
#   bash bench/gpu_device.sh [gpu_mfu.py options]      # results in $OUT (the device tool) or bench/results
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
log="$out/gpu_device.log"
: >"$log"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_device: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log"
python3 -c 'import torch, deepspeed; print("torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__)' 2>&1 | tail -1 | tee -a "$log"
mfu() {  # NAME ARGS...: one run of gpu_mfu.py, its JSON as $out/gpu_mfu_NAME.json
  local name=$1; shift
  echo "== gpu_mfu.py $*" | tee -a "$log"
  PYTHONUNBUFFERED=1 python3 bench/gpu_mfu.py "$@" --out "$out/gpu_mfu_$name.json" 2>&1 | tee -a "$log"
}
mfu main --profile-steps 3 "$@"
for mb in 32 64; do
  mfu "mb$mb" --micro-batch "$mb" --compile off --fp16-steps 0 --steps 20 "$@"
done
quick=(--compile off --fp16-steps 0 --steps 10 --warmup 2)
mfu zero1 --zero 1 "${quick[@]}" "$@"
mfu zero3 --zero 3 "${quick[@]}" "$@"
mfu accum4 --grad-accum 4 --micro-batch 8 "${quick[@]}" "$@"
