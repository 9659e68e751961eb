#!/usr/bin/env bash
# Issue 11 item 3 on a GPU: `bench` isolated by default (a planted crash and a sticky CUDA error
# become CRASH rows, torch still timed), and the isolation overhead on the torch_ext smoke bench.
#   OUT=dir scripts/gpu/bench_isolation.sh      (about 5 minutes on an H100)
# Writes $OUT/crash, $OUT/iso, $OUT/inproc (results.json, report.md) and $OUT/summary.txt.
set -uo pipefail
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
C='[{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[256,256],"b":[256]}},{"op":"binary_backward","dtype":"f32","params":{"fn":"add","a":[1024],"b":[1]}}]'
GRADORACLE_BACKENDS=planted_crash PYTHONPATH=tests python3 -m harness bench --cases "$C" --backend planted_crash@correct \
  --backend planted_cuda@illegal_address --backend torch --device cuda --budget 0.2 --report "$OUT/crash" --no-plots \
  > "$OUT/crash.log" 2>&1
echo "crash bench rc=$? (expected 1: CRASH rows for the illegal address, torch timed on both cases)" | tee "$OUT/summary.txt"
for mode in iso inproc; do
  flag=(); [[ $mode == inproc ]] && flag=(--no-isolate)
  s=$(date +%s.%N)
  python3 -m harness bench --cases smoke --backend torch_ext --device cuda --budget 0.2 --warmup-budget 0.1 -q --no-plots \
    "${flag[@]}" --report "$OUT/$mode" > "$OUT/$mode.log" 2>&1
  echo "$mode rc=$? wall $(echo "$(date +%s.%N) - $s" | bc) s" | tee -a "$OUT/summary.txt"
done
