#!/usr/bin/env bash
# Issue 17 on one H100: the lean fa2 attention backward (cupy@fa2_lean, cupy@fa2_lean_det: query
# sub-blocks in the main kernel, red.v2 dQ adds, 16-byte preprocess / dq convert) against cupy@fa2.
#   OUT=/some/dir bash scripts/gpu/cuda_attn_swz.sh    (from the repo root; about 8 minutes)
# Steps (STEPS="smoke repeat bench profile ncu" by default; any subset, in that order), each under its
# own time limit (timeout -k 15 -s INT: the harness still writes its JSON checkpoint):
#   smoke    harness run --cases smoke, cupy@fa2_lean, cupy@fa2_lean_det          -> smoke.{json,log} (<= 55 s)
#   repeat   --repeat 20 on scripts/gpu/cases/cuda_attn_repeat.json, both lean variants (the _det
#            one bitwise equal over the 20 calls)                                  -> repeat.{json,log} (<= 30 s)
#   bench    harness bench (cold) of cupy@fa2, cupy@fa2_lean, sdpa_flash on the first 6 cases of
#            scripts/gpu/cases/attn_s4.json, --time-limit BENCH_S = 300 -> bench/{results.json,report.md},
#            $OUT/summary.txt (TFLOP/s, lean/fa2, fa2/flash and lean/flash per case) (<= 310 s)
#   profile  harness profile of cupy@fa2_lean on bf16 B=1 Sq=Sk=4096 Hq=32 Hkv=8 D=128 causal
#            (today's fa2 reading to compare: attn_fa2_main 2413.7 us, 255 regs)  -> profile.{json,txt} (<= 70 s)
#   ncu      the shared-memory question of issue 17, on the same case (no tuning, default tiles), for
#            cupy@fa2 and cupy@fa2_lean: ldmatrix / LDS / STS instructions, wavefronts and bank-conflict
#            counts per kernel (ideal ldmatrix.x4 = 4 wavefronts each: wavefronts - 4 x instructions is the
#            address-pattern excess; the conflict counter above that is not from addresses), plus
#            registers and local memory per kernel (cupy's function attributes)    -> ncu.{csv,log}, regs.log (<= 50 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/cuda_attn_swz.tgz (everything else, under res/).
# Typical 7-8 minutes (the bench takes most of its 300 s); every step at its limit: about 9.5.
# Knobs: PYTHON=python3 STEPS=... BENCH_S=300 BUDGET=0.2
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-smoke repeat bench profile ncu} BENCH_S=${BENCH_S:-300} BUDGET=${BUDGET:-0.2}
mkdir -p "$OUT/res"
R=$OUT/res
exec > >(tee "$OUT/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
statuses() { awk '$2 == "attention_backward" {print $1, $3}' "$@" | sort | uniq -c; }
CASE='{"op":"attention_backward","dtype":"bf16","params":{"B":1,"Sq":4096,"Sk":4096,"Hq":32,"Hkv":8,"D":128,"causal":true}}'

stamp "== setup"
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1

if has smoke; then
  stamp "== smoke: cupy@fa2_lean, cupy@fa2_lean_det"
  timeout -k 15 -s INT 55 $PY -m harness run --op attention_backward --backend cupy@fa2_lean \
    --backend cupy@fa2_lean_det --cases smoke --device cuda --json "$R/smoke.json" > "$R/smoke.log" 2>&1
  echo "exit $?"; tail -3 "$R/smoke.log"; statuses "$R/smoke.log"
  grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$R/smoke.log" | head -20
fi

if has repeat; then
  stamp "== repeat: 20 calls per case, both lean variants"
  timeout -k 15 -s INT 30 $PY -m harness run --op attention_backward --backend cupy@fa2_lean --backend cupy@fa2_lean_det \
    --cases scripts/gpu/cases/cuda_attn_repeat.json --device cuda --repeat 20 --json "$R/repeat.json" > "$R/repeat.log" 2>&1
  echo "exit $?"; tail -2 "$R/repeat.log"; statuses "$R/repeat.log"
  grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$R/repeat.log" | head -10
fi

if has bench; then
  stamp "== bench: cupy@fa2, cupy@fa2_lean, sdpa_flash on attn_s4.json's first 6 cases"
  $PY -c "import json, sys; d = json.load(open('scripts/gpu/cases/attn_s4.json')); d['cases'] = d['cases'][:6]; \
json.dump(d, open(sys.argv[1], 'w'), indent=1)" "$R/cases6.json"
  timeout -k 15 -s INT "$((BENCH_S + 10))" $PY -m harness bench --op attention_backward --backend cupy@fa2 \
    --backend cupy@fa2_lean --backend sdpa_flash --cases "$R/cases6.json" --device cuda --budget "$BUDGET" \
    --time-limit "$BENCH_S" --report "$R/bench" --no-plots > "$R/bench.log" 2> "$R/bench.err"
  echo "exit $?"; tail -3 "$R/bench.err"
  stamp "== summary -> $OUT/summary.txt"
  $PY scripts/gpu/tflops_table.py "$R/bench/results.json" --impl cupy@fa2 --impl cupy@fa2_lean --impl sdpa_flash \
    --ratio cupy@fa2_lean/cupy@fa2 --ratio cupy@fa2/sdpa_flash --ratio cupy@fa2_lean/sdpa_flash | tee "$OUT/summary.txt"
fi

if has profile; then
  stamp "== profile: cupy@fa2_lean on $CASE"
  timeout -k 15 -s INT 70 $PY -m harness profile --op attention_backward --backend cupy@fa2_lean --case "$CASE" \
    --json "$R/profile.json" > "$R/profile.txt" 2>&1
  echo "exit $?"; tail -40 "$R/profile.txt"
fi

if has ncu; then
  stamp "== ncu: shared-memory wavefronts / conflicts of cupy@fa2 and cupy@fa2_lean (default tiles)"
  cat > "$R/ncu_driver.py" <<'EOF'
"""One call of each variant on the issue-17 case (after a warm-up call that compiles), for ncu."""
import sys
import cupy, ml_dtypes, numpy as np
from backends.cupy import attention_backward as A
b, sq, sk, hq, hkv, d = 1, 4096, 4096, 32, 8, 128
rng = np.random.default_rng(0)
r = lambda *sh: cupy.asarray(rng.standard_normal(sh, dtype=np.float32).astype(ml_dtypes.bfloat16))  # noqa: E731
x = {"q": r(b, sq, hq, d), "k": r(b, sk, hkv, d), "v": r(b, sk, hkv, d), "o": r(b, sq, hq, d), "do": r(b, sq, hq, d),
     "lse": cupy.full((b, hq, sq), 8.0, dtype=cupy.float32)}
outs = {"dq": cupy.empty_like(x["q"]), "dk": cupy.empty_like(x["k"]), "dv": cupy.empty_like(x["v"])}
params = {"causal": True}
dev = A.device()
for variant in sys.argv[1:]:
    A.call(dev, variant, x, outs, params)  # compile (cached) + warm
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    A.call(dev, variant, x, outs, params)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
for expr, fn in dev._fns.items():
    at = fn.attributes
    print(f"REGS {expr}: {at.get('num_regs')} registers, local {at.get('local_size_bytes')} B", flush=True)
EOF
  NCU=$($PY -c "from harness.profile import find_ncu; print(find_ncu() or '')")
  if [[ -z "$NCU" ]]; then
    echo "no ncu: registers only"
    GRADORACLE_CUPY_ATTN_TUNE=0 timeout -k 10 40 $PY "$R/ncu_driver.py" fa2 fa2_lean 2>&1 | tee "$R/regs.log"
  else
    timeout 10 "$NCU" --query-metrics --chip gh100 > "$R/ncu_metrics.txt" 2>&1
    want="l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld
      l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm
      l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st
      l1tex__data_bank_conflicts_pipe_lsu_mem_shared l1tex__data_pipe_lsu_wavefronts_mem_shared
      smsp__inst_executed_op_ldsm smsp__inst_executed_op_shared_ld smsp__inst_executed_op_shared_st
      smsp__inst_executed_op_ldgsts smsp__inst_executed_op_global_red smsp__inst_executed_op_global_atom
      smsp__warp_issue_stalled_lg_throttle_per_warp_active smsp__warp_issue_stalled_short_scoreboard_per_warp_active
      gpu__time_duration"
    metrics=""
    for m in $want; do
      if grep -qE "^\s*$m\b" "$R/ncu_metrics.txt"; then
        case $m in *per_warp_active) metrics="$metrics,$m.pct" ;; *) metrics="$metrics,$m.sum" ;; esac
      else echo "ncu: no metric $m on this chip"; fi
    done
    metrics=${metrics#,}
    [[ -z "$metrics" ]] && metrics="l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
    GRADORACLE_CUPY_ATTN_TUNE=0 timeout -k 10 -s INT 40 "$NCU" --profile-from-start off --clock-control none \
      --kernel-name regex:attn_ \
      --metrics "$metrics" --csv --page raw $PY "$R/ncu_driver.py" fa2 fa2_lean > "$R/ncu.csv" 2> "$R/ncu.log"
    echo "exit $?"; tail -3 "$R/ncu.log"; grep REGS "$R/ncu.csv" | tee "$R/regs.log"
    $PY - "$R/ncu.csv" <<'EOF'
import csv, io, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(io.StringIO("".join(lines))))
for r in rows[1:] if rows and rows[0].get("ID", "").strip() == "" else rows:
    name = r.get("Kernel Name", "?")[:60]
    vals = {k: v for k, v in r.items() if "__" in k}
    print(name)
    for k, v in vals.items():
        print(f"   {k:75s} {v}")
    ldsm, wf = vals.get("smsp__inst_executed_op_ldsm.sum"), vals.get("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum")
    try:
        n, w = float(ldsm.replace(",", "")), float(wf.replace(",", ""))
        print(f"   ldmatrix wavefronts / instruction: {w / n:.3f} (4.000 = x4 with no address conflicts)" if n else "")
    except (AttributeError, ValueError):
        pass
EOF
  fi
fi
stamp "== pack"
tar -czf "$OUT/cuda_attn_swz.tgz" -C "$OUT" res && rm -rf "$R"
stamp "== done"
