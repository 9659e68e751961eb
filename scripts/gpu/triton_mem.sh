#!/usr/bin/env bash
# Issue 13's memory-bound misses (reduce_sum bf16 column sums and full sum, binary_backward add/sub bf16
# with B broadcast, small norms, host time per call), one batch of under 8 minutes on an H100:
#   OUT=/some/dir bash scripts/gpu/triton_mem.sh            (from the repo root)
# Steps (STEPS="install asm host smoke bench variants profile"; any subset, in that order; "presets" is off
# by default: it compiles every preset for every case and would take the variants' time):
#   install   pip install -q -e . --no-deps --no-build-isolation
#   asm       the bf16 column-sum kernel as the device's triton compiles it (default, finish_last,
#             tiles, stages3_tiles): ops of its TTGIR and PTX in the main loop and after the tile ticket
#             (convert_layout, local_*, bar.sync, st/ld.shared), registers, shared memory
#                                                                      -> asm.txt, asm/*.ttgir, *.ptx
#   host      host us per unchecked call (perf_counter over 200 calls queued behind a GPU spin, best of 5)
#             of the small norms, the bf16 full and column sums, add bf16 B=4096, their device us, and the
#             host us with the launches stubbed (the Python alone)          -> host.txt
#   smoke     harness run --cases smoke of the four ops through triton, then reduce_sum through
#             triton@stages3_tiles (25 s)                                       -> smoke.log, smoke-stages3.log
#   presets   scripts/gpu/triton_tune_info.py --presets on the reduce_sum cases (quick event timings of
#             every reduce_sum.PRESETS entry, registers)                 -> presets.json, presets.log
#   bench     harness bench of the four ops' perf cases through triton (host column) -> bench/, bench.log
#   variants  the focus cases (bf16 column sums, bf16 full sum, add/sub bf16 with B broadcast) with
#             triton beside triton@{REDUCE_VARIANTS} and triton@{BINARY_VARIANTS} -> variants/
#   profile   harness profile (ncu) of the bf16 column sum, default and triton@$PROFILE_VARIANT -> profile/
# Then summary.txt (scripts/gpu/triton_tune_report.py: % of copy, bar, host ms with "!" where over
# the device time; the variants side by side).  Everything ends up in $OUT/triton-mem.tgz plus
# summary.txt and run.log beside it.  Limits (s): SMOKE_LIMIT=40 BENCH_LIMIT=130 VARIANTS_LIMIT=100 (each
# variant compiles on its first call) PROFILE_LIMIT=60, asm 60 and host 90 at most: about 7.5 minutes in all.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-install asm host smoke bench variants profile}
SMOKE_LIMIT=${SMOKE_LIMIT:-40} PRESETS_LIMIT=${PRESETS_LIMIT:-30} BENCH_LIMIT=${BENCH_LIMIT:-130}
VARIANTS_LIMIT=${VARIANTS_LIMIT:-100} PROFILE_LIMIT=${PROFILE_LIMIT:-60} BUDGET=${BUDGET:-0.1}
REDUCE_VARIANTS=${REDUCE_VARIANTS:-finish_last,tiles,stages3,stages3_tiles,stages6,waves2}
BINARY_VARIANTS=${BINARY_VARIANTS:-wide,wide4,lean_noprefetch}
PROFILE_VARIANT=${PROFILE_VARIANT:-tiles}
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
  GRADORACLE_TRITON_REDUCE_VARIANTS=$REDUCE_VARIANTS timeout -k 15 -s TERM 60 $PY - "$R/asm" > "$R/asm.txt" 2>&1 <<'EOF'
import re, sys, torch
from backends.triton import reduce_sum as rs
out = sys.argv[1]
x = torch.randn(8, 2048, 4096, device="cuda", dtype=torch.bfloat16)
y = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
for name in ["default"] + [n for n in ("finish_last", "tiles", "stages3_tiles") if n in rs.PRESETS]:
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
    fin = ptx[ptx.index("atom.global"):] if "atom.global" in ptx else ""
    for pat in ("bar.sync", "st.shared", "ld.shared", "cp.async", "ld.global"):
        print(f"  ptx {pat}: {len(re.findall(re.escape(pat), ptx))} ({len(re.findall(re.escape(pat), loop))} in the "
              f"first loop, {len(re.findall(re.escape(pat), fin))} from the tile ticket on)")
EOF
  echo "exit $?"; cat "$R/asm.txt" | head -40
fi

if has host; then
  stamp "== host: us per call, whole and Python alone"
  timeout -k 15 -s TERM 90 $PY - > "$R/host.txt" 2>&1 <<'EOF'
import time, torch
from backends.triton import _steps, binary_backward as bb, reduce_sum as rs
from backends.triton import layernorm_backward as lnb, rmsnorm_backward as rmb
dev = "cuda"
def t(*s, dt=torch.float32):
    return torch.randn(*s, device=dev, dtype=dt)
def norm(fn, M, K, dt, mean=True):
    i = {"x": t(M, K, dt=dt), "dy": t(M, K, dt=dt), "weight": t(K, dt=dt), "rstd": t(M).abs() + 1}
    if mean:
        i["mean"] = t(M)
    o = {"dx": torch.empty(M, K, device=dev, dtype=dt), "dweight": torch.empty(K, device=dev, dtype=dt)}
    if mean:
        o["dbias"] = torch.empty(K, device=dev, dtype=dt)
    return fn, i, o, {}
bf = torch.bfloat16
cases = {
    "rms f32 1024x2048": norm(rmb.rmsnorm_backward, 1024, 2048, torch.float32, mean=False),
    "ln f32 1024x2048": norm(lnb.layernorm_backward, 1024, 2048, torch.float32),
    "ln bf16 2048x4096": norm(lnb.layernorm_backward, 2048, 4096, bf),
    "sum bf16 X=33554432": (rs.reduce_sum, {"x": t(33554432, dt=bf)}, {"y": torch.empty((), device=dev, dtype=bf)},
                            {"axes": None}),
    "sum_to bf16 T=4096": (rs.reduce_sum, {"x": t(8, 2048, 4096, dt=bf)},
                           {"y": torch.empty(4096, device=dev, dtype=bf)}, {"target": [4096]}),
    "add bf16 B=4096": (bb.binary_backward, {"a": t(8, 2048, 4096, dt=bf), "b": t(4096, dt=bf),
                                             "grad_out": t(8, 2048, 4096, dt=bf)},
                        {"grad_a": torch.empty(8, 2048, 4096, device=dev, dtype=bf),
                         "grad_b": torch.empty(4096, device=dev, dtype=bf)}, {"fn": "add"}),
}
def host_us(f, n=200):
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of ms of spin: the launch queue never blocks the host
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt
def device_us(f, n=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); torch.cuda._sleep(50_000_000); s.record()
    for _ in range(n):
        f()
    e.record(); e.synchronize()
    return s.elapsed_time(e) / n * 1e3
rows = {}
for name, (fn, i, o, p) in cases.items():
    fn(i, o, p)
    u = lambda: fn.unchecked(i, o, p)
    rows[name] = [min(host_us(u) for _ in range(5)), device_us(u)]
real_call, real_launch = _steps.Step.__call__, _steps.Step.launch
_steps.Step.__call__ = _steps.Step.launch = lambda self, *a, **k: None
for name, (fn, i, o, p) in cases.items():
    rows[name].append(min(host_us(lambda: fn.unchecked(i, o, p)) for _ in range(5)))
_steps.Step.__call__, _steps.Step.launch = real_call, real_launch
print(f"{'case':24s} {'host us':>8s} {'device us':>9s} {'python us':>9s}  host<device   (python: launches stubbed)")
for name, (h, d, py) in rows.items():
    print(f"{name:24s} {h:8.1f} {d:9.1f} {py:9.1f}  {'yes' if h < d else 'NO'}")
EOF
  echo "exit $?"; cat "$R/host.txt"
fi

if has smoke; then
  stamp "== smoke: the four ops through triton (at most ${SMOKE_LIMIT}s)"
  timeout -k 15 -s TERM "$SMOKE_LIMIT" $PY -m harness run "${ops[@]}" --backend triton --device cuda --cases smoke \
    --json "$R/smoke.json" > "$R/smoke.log" 2>&1
  echo "exit $? (124: cut)"
  grep -E "^(FAIL|ERROR|CRASH)" "$R/smoke.log" | cut -c1-200 | head -12; tail -2 "$R/smoke.log"
  stamp "== smoke: reduce_sum through triton@stages3_tiles (pipelined loop, finish tiles; at most 25s)"
  GRADORACLE_TRITON_REDUCE_VARIANTS=stages3_tiles timeout -k 15 -s TERM 25 $PY -m harness run --op reduce_sum \
    --backend triton@stages3_tiles --device cuda --cases smoke --json "$R/smoke-stages3.json" \
    > "$R/smoke-stages3.log" 2>&1
  echo "exit $? (124: cut)"
  grep -E "^(FAIL|ERROR|CRASH)" "$R/smoke-stages3.log" | cut -c1-200 | head -12; tail -2 "$R/smoke-stages3.log"
fi

if has presets; then
  stamp "== presets: reduce_sum, every preset quick-timed (at most ${PRESETS_LIMIT}s)"
  timeout -k 15 -s TERM $(( PRESETS_LIMIT + 15 )) $PY scripts/gpu/triton_tune_info.py --op reduce_sum --presets \
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
  GRADORACLE_TRITON_REDUCE_VARIANTS=$PROFILE_VARIANT OUT=$R timeout -k 15 -s TERM "$PROFILE_LIMIT" \
    bash scripts/gpu/profile_cases.sh "$WORK/profile.list" > "$R/profiles.txt" 2>&1
  echo "exit $?"
  grep -E "^(==|kernel|  time|  occupancy|  sectors|  grid|  top)" "$R/profiles.txt" | cut -c1-160
fi
stamp "== done"
tar -czf "$OUT/triton-mem.tgz" -C "$OUT" triton-mem && rm -rf "$R"
ls -la "$OUT"
