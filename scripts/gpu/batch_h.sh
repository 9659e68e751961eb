#!/usr/bin/env bash
# Batch H (one device call, ~8.5 min): the CUDA tensor-core kernels' first GPU check.
#  1. pip install; the torch_ext build (now with matmul, attention, conv) in the background;
#  2. scripts/jobs/cuda-tc-1.txt side by side (PAR s): smoke of every cupy variant, best on full, fa2_det --repeat 50;
#  3. torch_ext on the smoke sets of the three ops (EXT_S s), once built;
#  4. short cold benches (perf cases): matmul, attention, conv dgrad/wgrad beside torch/cuDNN, SDPA and triton.
# $OUT/h.tgz has everything; stdout the summaries.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
export XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
base=$OUT; W=$(mktemp -d)/h; mkdir -p "$W"
trap 'tar -czf "$base/h.tgz" -C "$(dirname "$W")" h 2>/dev/null' EXIT
exec > >(tee "$base/log.txt") 2>&1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
( timeout 420 python3 -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')" \
    > "$W/build.log" 2>&1 ) &
build=$!
OUT=$W/par bash scripts/gpu_parallel_run.sh scripts/jobs/cuda-tc-1.txt "${PAR:-200}" > /dev/null 2>&1
stamp "parallel done"; cat "$W/par/summary.txt"
cp "$W/par/runs.tar.gz" "$base/par-runs.tar.gz" 2>/dev/null
wait $build; stamp "build: $(tail -1 "$W/build.log")"
timeout "${EXT_S:-45}" python3 -m harness run --device cuda --op matmul_backward --op attention_backward \
  --op conv_backward_data --op conv_backward_weight --backend torch_ext --cases smoke --seed 5 --json "$W/ext.json" \
  > "$W/ext.log" 2>&1
stamp "torch_ext smoke: $(tail -1 "$W/ext.log")"; grep -E "^(FAIL|ERROR|CRASH)" "$W/ext.log" | head -10
common=(--device cuda --mode cold --budget 0.1 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q --cases perf)
b() { local name=$1 lim=$2; shift 2
  timeout $((lim + 30)) python3 -m harness bench "${common[@]}" "$@" --time-limit "$lim" --report "$W/$name" > "$W/$name.log" 2>&1
  stamp "$name: $(grep timed "$W/$name.log" | tail -1)"; grep -E "^(matmul|attention|conv)" "$W/$name.log" | head -40; }
b mm "${MM_S:-35}" --op matmul_backward --dtype bf16 --backend torch --backend triton --backend cupy@best --backend torch_ext
b attn "${AT_S:-50}" --op attention_backward --per-op 4 --backend sdpa_flash --backend sdpa_cudnn --backend triton \
  --backend cupy@fa2 --backend cupy@fa2_det
b conv "${CV_S:-45}" --op conv_backward_data --op conv_backward_weight --dtype bf16 --interleave --backend torch \
  --backend triton --backend cupy@best
stamp done
