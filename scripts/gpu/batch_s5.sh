#!/usr/bin/env bash
# Fifth session, one H100 call (about 7 device minutes were left): what issue 13 still lacks.
#   OUT=/some/dir bash scripts/gpu/batch_s5.sh          (from the repo root; about 4.5 minutes)
# Steps, each under its own time limit (timeout -s INT: the harness still writes its JSON checkpoint):
#   host     scripts/gpu/triton_norms_host.py on the norms perf cases, smallest first: the default (Step by
#            Step), fast=1,ws_cache=1 and fast=1,finish=last,ws_cache=1: device, host, loop per call,
#            same bits, error against float64                                  -> norms_host.json (<= 95 s)
#   profile  harness profile (ncu) of triton on the both-broadcast miss mul[bf16,A=1x2048x4096,B=8x2048x1]
#                                                                              -> profile.{json,txt} (<= 70 s)
#   full     harness run --cases full through triton, 8 shards side by side: reduce_sum, layernorm_backward
#            and rmsnorm_backward with GRADORACLE_TRITON_NORM=fast=1,ws_cache=1 (the candidate default,
#            so every call after a case's first goes through the fast closure and the kept workspace);
#            binary_backward's one full case no earlier run reached, and its smoke set (the lean launch
#            path after b954b32)                                               -> full-*.{json,log} (<= 140 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s5.tgz (res/: everything, re-packed after each step).
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} STEPS=${STEPS:-host profile full}
. scripts/gpu/steps.sh
pack() { tar czf "$OUT/s5.tgz" -C "$OUT" res; }

stamp "== setup"
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if has host; then
  stamp "== host: triton norms, default vs fast closure + kept workspace"
  timeout -s INT 95 $PY scripts/gpu/triton_norms_host.py --budget 75 \
    --configs ";fast=1,ws_cache=1;fast=1,finish=last,ws_cache=1" --json "$R/norms_host.json" > "$R/norms_host.log" 2>&1
  echo "exit $?"; tail -4 "$R/norms_host.log"; pack
fi

if has profile; then
  stamp "== profile: triton both-broadcast"
  timeout -s INT 70 $PY -m harness profile --op binary_backward --backend triton \
    --case '{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}' \
    --json "$R/profile.json" > "$R/profile.txt" 2>&1
  echo "exit $?"; tail -40 "$R/profile.txt"; pack
fi

if has full; then
  stamp "== full: triton reduce_sum + norms (fast closure), binary's missing case + smoke"
  pids=()
  for k in 0 1 2 3 4 5 6; do
    GRADORACLE_TRITON_NORM=fast=1,ws_cache=1 timeout -s INT 140 $PY -m harness run --backend triton \
      --op reduce_sum --op layernorm_backward --op rmsnorm_backward --cases full --device cuda \
      --shard "$k/7" --json "$R/full-$k.json" > "$R/full-$k.log" 2>&1 &
    pids+=($!)
  done
  ( timeout -s INT 140 $PY -m harness run --backend triton --op binary_backward \
      --cases scripts/gpu/cases/binary_full_s5.json --device cuda --json "$R/full-bin1.json" > "$R/full-bin1.log" 2>&1
    timeout -s INT 60 $PY -m harness run --backend triton --op binary_backward --cases smoke --device cuda \
      --json "$R/full-binsmoke.json" > "$R/full-binsmoke.log" 2>&1 ) &
  pids+=($!)
  for p in "${pids[@]}"; do wait "$p"; done
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log
  pack
fi

{ stamp "== done"; for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  tail -60 "$R/norms_host.log"; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"
