#!/usr/bin/env bash
# Issue 13's memory-bound misses (reduce_sum bf16 column sums and full sum, binary_backward add/sub bf16
# with B broadcast, small norms, host time per call), one batch of under 8 minutes on an H100:
#   OUT=/some/dir bash scripts/gpu/triton_mem.sh            (from the repo root)
# Steps (STEPS="install asm smoke presets bench variants profile"; any subset, in that order):
#   install   pip install -q -e . --no-deps --no-build-isolation
#   asm       the bf16 column-sum kernel as the device's triton compiles it (default and the STAGES variant):
#             ops of its TTGIR and PTX inside and outside the main loop (convert_layout, local_*,
#             bar.sync, st/ld.shared), registers, shared memory          -> asm.txt, asm/*.ttgir, *.ptx
#   smoke     harness run --cases smoke of the four ops through triton    -> smoke.log
#   presets   scripts/gpu/triton_tune_info.py --presets on the reduce_sum cases (quick event timings of
#             every reduce_sum.PRESETS entry, registers)                 -> presets.json, presets.log
#   bench     harness bench of the four ops' perf cases through triton (host column) -> bench/, bench.log
#   variants  the focus cases (bf16 column sums, bf16 full sum, add/sub bf16 with B broadcast) with
#             triton beside triton@{REDUCE_VARIANTS} and triton@{BINARY_VARIANTS} -> variants/
#   profile   harness profile (ncu) of the bf16 column sum, default and triton@$PROFILE_VARIANT -> profile/
# Then summary.txt (scripts/gpu/triton_tune_report.py: % of copy, bar, host ms with "!" where over
# the device time; the variants side by side).  Everything ends up in $OUT/triton-mem.tgz plus
# summary.txt and run.log beside it.  Limits (s): SMOKE_LIMIT=60 PRESETS_LIMIT=40 BENCH_LIMIT=170
# VARIANTS_LIMIT=60 PROFILE_LIMIT=70: about 7.5 minutes with start-up.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-install asm smoke presets bench variants profile}
SMOKE_LIMIT=${SMOKE_LIMIT:-60} PRESETS_LIMIT=${PRESETS_LIMIT:-40} BENCH_LIMIT=${BENCH_LIMIT:-170}
VARIANTS_LIMIT=${VARIANTS_LIMIT:-60} PROFILE_LIMIT=${PROFILE_LIMIT:-70} BUDGET=${BUDGET:-0.1}
REDUCE_VARIANTS=${REDUCE_VARIANTS:-stages3,stages4,unroll2,waves2,prefetch,before}
BINARY_VARIANTS=${BINARY_VARIANTS:-wide,lean_noprefetch}
PROFILE_VARIANT=${PROFILE_VARIANT:-stages3}
R=$OUT/triton-mem
WORK=$(mktemp -d /tmp/gradoracle-mem.XXXXXX)
export GRADORACLE_CACHE=$WORK/cache  # one ceilings measurement for both benches
mkdir -p "$R"
exec > >(tee "$OUT/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
ops=(--op reduce_sum --op binary_backward --op layernorm_backward --op rmsnorm_backward)

stamp "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -2
git log --oneline -1 2>/dev/null
if has install; then
  stamp "== install"
  $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -3
fi
$PY -c "import torch, triton, harness; print('torch', torch.__version__, 'triton', triton.__version__, harness.__file__)"

# The focus cases: the misses of results/h100/triton/tune-2.
$PY - "$WORK/focus.json" <<'EOF'
import json, sys
L = [8, 2048, 4096]
b = lambda fn, a, bb: {"op": "binary_backward", "dtype": "bf16", "params": {"fn": fn, "a": a, "b": bb}}
r = lambda dt, shape, **p: {"op": "reduce_sum", "dtype": dt, "params": {"shape": shape, **p}}
cases = [r("bf16", L, target=[4096]), r("bf16", L, target=[8, 1, 4096]), r("bf16", [16384, 4096], axes=[0]),
         r("bf16", [33554432], axes=None), r("f32", L, target=[8, 1, 4096]), r("bf16", L, target=[1, 2048, 4096]),
         b("add", L, [4096]), b("add", L, [8, 1, 4096]), b("sub", L, [4096]), b("mul", L, [4096])]
json.dump({"cases": cases}, open(sys.argv[1], "w"))
EOF

if has asm; then
  stamp "== asm: the bf16 column sum as compiled here"
  mkdir -p "$R/asm"
  GRADORACLE_TRITON_REDUCE_VARIANTS=$REDUCE_VARIANTS timeout -s TERM 60 $PY - "$R/asm" > "$R/asm.txt" 2>&1 <<'EOF'
import re, sys, torch
from backends.triton import reduce_sum as rs
out = sys.argv[1]
x = torch.randn(8, 2048, 4096, device="cuda", dtype=torch.bfloat16)
y = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
for name in ["default"] + [n for n in ("stages3", "stages4", "unroll2") if n in rs.PRESETS]:
    cfg = rs.PRESETS[name]
    rs.run({"x": x}, {"y": y}, {"target": [4096]}, cfg)
    P = rs._prepare(x, y, {"target": [4096]}, cfg)
    k = P.main.compiled
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    open(f"{out}/{name}.ttgir", "w").write(ttgir)
    open(f"{out}/{name}.ptx", "w").write(ptx)
    # the main loop of the PTX: from the first loop label to its back branch
    m = re.search(r"\n(\$L__BB0_\d+):[^\n]*\n(.*?)\n\s*@%p\d+ bra\s+\1;", ptx, re.S)
    loop = m.group(2) if m else ""
    print(f"{name}: grid {P.L.grid} chunks {P.L.chunks} warps {P.L.num_warps} {P.L.constexprs}")
    print(f"  regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}")
    for pat in ("ttg.convert_layout", "ttg.local_alloc", "ttg.local_load", "ttg.local_store", "async_copy", "scf.for"):
        print(f"  ttgir {pat}: {ttgir.count(pat)}")
    for pat in ("bar.sync", "st.shared", "ld.shared", "cp.async", "ld.global"):
        print(f"  ptx {pat}: {len(re.findall(re.escape(pat), ptx))} ({len(re.findall(re.escape(pat), loop))} in the first loop)")
EOF
  echo "exit $?"; cat "$R/asm.txt" | head -40
fi

if has smoke; then
  stamp "== smoke: the four ops through triton (at most ${SMOKE_LIMIT}s)"
  timeout -s TERM "$SMOKE_LIMIT" $PY -m harness run "${ops[@]}" --backend triton --device cuda --cases smoke \
    --json "$R/smoke.json" > "$R/smoke.log" 2>&1
  echo "exit $? (124: cut)"
  grep -E "^(FAIL|ERROR|CRASH)" "$R/smoke.log" | cut -c1-200 | head -12; tail -2 "$R/smoke.log"
fi

if has presets; then
  stamp "== presets: reduce_sum, every preset quick-timed (at most ${PRESETS_LIMIT}s)"
  timeout -s TERM $(( PRESETS_LIMIT + 15 )) $PY scripts/gpu/triton_tune_info.py --op reduce_sum --presets \
    --time-limit "$PRESETS_LIMIT" --json "$R/presets.json" > "$R/presets.log" 2>&1
  echo "exit $?"
fi

bench=(bench --device cuda --interleave -q --budget "$BUDGET" --warmup-budget 0.1)
if has bench; then
  stamp "== bench: perf cases of the four ops through triton (pairs started within ${BENCH_LIMIT}s)"
  $PY -m harness "${bench[@]}" "${ops[@]}" --backend triton --cases perf --time-limit "$BENCH_LIMIT" \
    --no-plots --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"
  grep -E "^(FAIL|ERROR)" "$R/bench.log" | cut -c1-200 | head -8
fi

if has variants; then
  stamp "== variants: focus cases, triton beside @{$REDUCE_VARIANTS} @{$BINARY_VARIANTS} (${VARIANTS_LIMIT}s)"
  impls=(--backend triton)
  for v in ${REDUCE_VARIANTS//,/ } ${BINARY_VARIANTS//,/ }; do impls+=(--backend "triton@$v"); done
  GRADORACLE_TRITON_VARIANTS=$BINARY_VARIANTS GRADORACLE_TRITON_REDUCE_VARIANTS=$REDUCE_VARIANTS \
    $PY -m harness "${bench[@]}" --op reduce_sum --op binary_backward "${impls[@]}" --cases "$WORK/focus.json" \
    --time-limit "$VARIANTS_LIMIT" --no-plots --report "$R/variants" > "$R/variants.log" 2>&1
  echo "exit $?"
  grep -E "^(FAIL|ERROR)" "$R/variants.log" | cut -c1-200 | head -8
fi

stamp "== tables"
$PY scripts/gpu/triton_tune_report.py --bench "$R/bench" --variants "$R/variants" --presets "$R/presets.json" \
  --bar layernorm_backward=85 --bar rmsnorm_backward=85 --misses "$R/misses.txt" | tee "$OUT/summary.txt"

if has profile; then
  stamp "== profile: bf16 column sum, triton and triton@$PROFILE_VARIANT (at most ${PROFILE_LIMIT}s)"
  c='{"op":"reduce_sum","dtype":"bf16","params":{"shape":[8,2048,4096],"target":[4096]}}'
  printf "reduce_sum triton %s\nreduce_sum triton@%s %s\n" "$c" "$PROFILE_VARIANT" "$c" > "$WORK/profile.list"
  GRADORACLE_TRITON_REDUCE_VARIANTS=$PROFILE_VARIANT OUT=$R timeout -s TERM "$PROFILE_LIMIT" \
    bash scripts/gpu/profile_cases.sh "$WORK/profile.list" > "$R/profiles.txt" 2>&1
  echo "exit $?"
  grep -E "^(==|kernel|  time|  occupancy|  sectors|  grid|  top)" "$R/profiles.txt" | cut -c1-160
fi
stamp "== done"
tar -czf "$OUT/triton-mem.tgz" -C "$OUT" triton-mem && rm -rf "$R"
ls -la "$OUT"
