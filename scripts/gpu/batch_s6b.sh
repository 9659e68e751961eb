#!/usr/bin/env bash
# The sixth session's last H100 call (about 8.5 minutes): what batch_s6.sh, cuda_attn_swz.sh and
# torch_ext_rows3.sh left.
#   OUT=/some/dir bash scripts/gpu/batch_s6b.sh          (from the repo root)
# Steps (STEPS="norms attn repeat full" by default), each under its own limit (timeout -s INT: the
# harness still writes its JSON checkpoint):
#   norms   harness bench (cold) of the 5 norms perf cases batch_s6.sh's bench did not reach
#           (scripts/gpu/cases/norms_rest_s6.json), the same five backends and flags, with the
#           triton one-launch finish for calls <= 32 MiB (the default once this lands)  -> norms/ (<= 150 s)
#   attn    harness bench (cold) of the three long attention perf cases (S=8k GQA causal, S=16k with and
#           without causal: scripts/gpu/cases/attn_long_s6.json): cupy@fa2_lean, cupy@fa2, sdpa_flash,
#           sdpa_cudnn                                                                   -> attn/ (<= 130 s)
#   repeat  --repeat 50 of cupy@fa2_lean_det on scripts/gpu/cases/cuda_attn_repeat.json -> repeat.{json,log} (<= 60 s)
#   full    harness run --cases full of attention_backward through cupy@fa2_lean and cupy@fa2_lean_det,
#           8 shards side by side                                                        -> full-*.{json,log} (<= FULL_S)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s6b.tgz (res/: everything, re-packed after each step).
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
PY=${PYTHON:-python3} STEPS=${STEPS:-norms attn repeat full} FULL_S=${FULL_S:-200}
. scripts/gpu/steps.sh
pack() { tar czf "$OUT/s6b.tgz" -C "$OUT" res; }
bench=(--device cuda --mode cold --budget 0.1 --warmup-budget 0.05 --min-samples 10 --max-samples 400 --interleave
       --no-plots -q)

stamp "== setup"
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1

if has norms; then
  stamp "== norms bench: the 5 cases left"
  GRADORACLE_TRITON_NORM=last_below=33554432 timeout -s INT 150 $PY -m harness bench "${bench[@]}" \
    --cases scripts/gpu/cases/norms_rest_s6.json --op layernorm_backward --op rmsnorm_backward --time-limit 140 \
    --backend torch --backend torch_compile --backend jax --backend triton --backend cupy@best \
    --report "$R/norms" > "$R/norms.log" 2>&1
  echo "exit $?"; tail -3 "$R/norms.log"; pack
fi

if has attn; then
  stamp "== attention bench: S=8k and 16k"
  timeout -k 15 -s INT 130 $PY -m harness bench "${bench[@]}" --op attention_backward \
    --cases scripts/gpu/cases/attn_long_s6.json --time-limit 120 --budget 0.2 \
    --backend cupy@fa2_lean --backend cupy@fa2 --backend sdpa_flash --backend sdpa_cudnn \
    --report "$R/attn" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -3 "$R/attn.log"
  $PY scripts/gpu/tflops_table.py "$R/attn/results.json" --impl cupy@fa2 --impl cupy@fa2_lean --impl sdpa_flash \
    --impl sdpa_cudnn --ratio cupy@fa2_lean/sdpa_flash --ratio cupy@fa2_lean/sdpa_cudnn > "$R/attn_table.txt" 2>&1
  cat "$R/attn_table.txt"; pack
fi

if has repeat; then attn_repeat cupy@fa2_lean_det 60; fi

if has full; then
  stamp "== full: attention through cupy@fa2_lean, cupy@fa2_lean_det (8 shards, $FULL_S s)"
  full_shards "$FULL_S" --op attention_backward --backend cupy@fa2_lean --backend cupy@fa2_lean_det --seed 6
fi

{ stamp "== done"; tail -2 "$R/norms.log" 2>/dev/null; cat "$R/attn_table.txt" 2>/dev/null
  tail -1 "$R/repeat.log" 2>/dev/null
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"
