#!/usr/bin/env bash
# binary_backward CUDA ladder (cupy@naive, @opt, @opt2, @best) and torch_ext (which launches @best's
# plan): the GPU batch.  Run from the repo root on a CUDA machine with $OUT a folder for the results:
#   OUT=/some/dir bash scripts/gpu/cupy_binary.sh                      (phase A, about 7-8 minutes)
#   OUT=/some/dir STEPS="prep full" bash scripts/gpu/cupy_binary.sh    (phase B, about 5-7 minutes)
# Steps (STEPS, any subset; default "prep smoke bench seed profile"; the run order is below):
#   prep     pip install -e (no deps), the torch_ext build started in the background, every cupy
#            instantiation compiled in parallel (NVRTC, into cupy's disk cache), then plans.txt:
#            registers / local bytes / blocks per SM of the kernels @best launches, and @best's plan
#            (kernel, 16-byte packs, grid, chunks, wave fill) for every perf case.
#   smoke    harness run: every cupy rung on the smoke set -> smoke.json / smoke.log; then (once
#            torch_ext is built) torch_ext -> smoke-torch_ext.json / .log
#   full     harness run: cupy@best and torch_ext on the full set -> full.json / full.log
#   bench    harness bench: torch, triton, cupy@opt, @opt2, @best, torch_ext on the perf cases
#            (BUDGET s per pair, no new pairs after TIME_LIMIT s) -> bench/{results.json,report.md}
#            (the ladder table and the time_ref / time_opt / speedup lines), bench.log, targets.txt
#            (@best and torch_ext: % of copy per perf case against the 88% bar)
#   seed     the seed compare program's cases (A=2x3x4x5 against B broadcast five ways, and A
#            broadcast once, f32 mul) through every cupy rung and torch, hot L2 -> seed/
#   profile  python -m harness profile, cupy@best, two perf cases (bias-like and row sums, bf16)
#            -> profile/*.txt, profile/*.json
#   tune     (phase C: OUT=... STEPS="prep tune", about 6 minutes) cupy@best on the mul perf cases
#            (bf16, f16, f32) under GRADORACLE_CUPY_BB = default, ur=1, ur=4, minblocks=2,
#            "ur=4,minblocks=2" (packs in flight per thread, blocks per SM the kernels are built for)
#            -> tune/<setting>/, tune.txt (% of copy per case and setting)
# Everything lands under $OUT; it is tarred into $OUT/cupy_binary.tgz at the end (the loose files
# stay).  Knobs: PY=python3 BUDGET=0.25 TIME_LIMIT=150 (bench) FULL_LIMIT=420 (s, full).
# Run order: prep, cupy smoke and the seed table while torch_ext builds, torch_ext smoke, full,
# bench, profile, tune.  Phase A budget: prep ~1.5 min, smoke+seed ~1.5, bench <= ~3, profile <= 2.5.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PY:-python3} STEPS=${STEPS:-prep smoke bench seed profile}
BUDGET=${BUDGET:-0.25} TIME_LIMIT=${TIME_LIMIT:-150} FULL_LIMIT=${FULL_LIMIT:-420}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
RUNGS=(--backend cupy@naive --backend cupy@opt --backend cupy@opt2 --backend cupy@best --backend torch_ext)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  git log --oneline -1
} 2>&1 | tee "$OUT/env.txt"

if has prep; then
  stamp "== prep: install, torch_ext build (background), NVRTC compiles"
  pip install -q -e . --no-deps --no-build-isolation > "$OUT/pip.log" 2>&1; echo "pip exit $?"
  if has smoke || has full || has bench; then  # the steps that run torch_ext
    $PY -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'built')" \
      > "$OUT/torch_ext_build.log" 2>&1 &
    build_pid=$!
  fi
  $PY - > "$OUT/plans.txt" 2>&1 <<'PYEOF'
import multiprocessing as mp
import time
from math import prod


def compile_one(expr):
    from backends.cupy import binary_backward as bb
    t = time.perf_counter()
    bb._function(expr)
    return expr, time.perf_counter() - t


if __name__ == "__main__":
    from backends._plans import binary_backward_cuda as cp
    from backends.cupy import binary_backward as bb
    from cases import select
    from harness import dtypes

    exprs = [e for dt in bb.DTYPES for e in bb.all_kernel_exprs(dt)]
    t = time.perf_counter()
    with mp.get_context("spawn").Pool(14) as pool:
        times = pool.map(compile_one, exprs, chunksize=2)
    print(f"{len(exprs)} instantiations compiled in {time.perf_counter() - t:.1f} s "
          f"(slowest {max(s for _, s in times):.1f} s)")
    dev = bb.CupyDevice()
    print(f"SMs {dev.num_sms()}")
    shown = [bb.kernel_expr(k, dt, fn, v) for dt in ("bf16", "f32") for fn in ("mul", "div")
             for k, v in (("cols", True), ("cols", False), ("rows", True), ("rows", False), ("fast", False),
                          ("lk8", False), ("lr_batched", False), ("ew", False), ("opt2", False))]
    for expr in shown:
        k = bb._function(expr)
        print(f"{expr:40s} regs {k.num_regs:3d} local {k.local_size_bytes:4d} B smem {k.shared_size_bytes:5d} B "
              f"blocks/SM {dev.blocks_per_sm(expr)}")
    print()
    for case in select("perf", op=bb.OP):
        a, b = tuple(case.params["a"]), tuple(case.params["b"])
        o = cp.bcast.broadcast_shape(a, b)
        st = cp.bcast.contiguous_strides
        dt = case.dtype
        entry = bb.build_entry("best", dt, case.params["fn"], ((a, st(a)), (b, st(b)), (o, st(o))), (0,) * 5,
                               dev.num_sms(), dev.blocks_per_sm)
        la = entry.launch
        w = la.words[-12:] if la.words else None
        per = dev.num_sms() * dev.blocks_per_sm(bb.kernel_expr(la.kind, dt, case.params["fn"], la.vectorized))
        items = w[8] if w else la.grid
        slots = per * (cp.BLOCK // w[0]) if la.kind == "rows" else per
        print(f"{case.id:55s} {la.kind:10s} vec={int(la.vectorized)} grid={la.grid:5d} resident={per:5d} "
              f"lanes={w[0] if w else '-':>3} ntiles={items:6d} fill={cp.wave_fill(items, slots):.2f} "
              f"chunks={la.nchunks}")
PYEOF
  echo "exit $?"; cat "$OUT/plans.txt" | head -80
fi
wait_build() {  # the torch_ext build started by prep (nvcc), before the first step that runs torch_ext
  if [ -n "${build_pid:-}" ]; then
    wait "$build_pid"; echo "torch_ext build exit $?"; tail -3 "$OUT/torch_ext_build.log"; build_pid=
  fi
}

if has smoke; then
  stamp "== smoke: every cupy rung (torch_ext builds meanwhile)"
  timeout 300 $PY -m harness run --op binary_backward "${RUNGS[@]:0:8}" --cases smoke --json "$OUT/smoke.json" \
    > "$OUT/smoke.log" 2>&1
  echo "exit $?"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/smoke.log" | head -40; tail -3 "$OUT/smoke.log"
fi

if has seed; then
  stamp "== seed: the compare program's shapes, every cupy rung and torch"
  SEED='['
  for b in '[2,3,4,5]' '[1,1,4,5]' '[2,3,4,1]' '[1,1,1]' '[1,3,1,5]'; do
    SEED+="{\"op\":\"binary_backward\",\"dtype\":\"f32\",\"params\":{\"fn\":\"mul\",\"a\":[2,3,4,5],\"b\":$b}},"
  done
  SEED+='{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[1,3,1,5],"b":[2,3,4,5]}}]'
  $PY -m harness bench --op binary_backward "${RUNGS[@]:0:8}" --backend torch --cases "$SEED" --mode hot \
    --budget 0.3 --report "$OUT/seed" -q > "$OUT/seed.log" 2>&1
  echo "exit $?"; tail -3 "$OUT/seed.log"
  [ -f "$OUT/seed/report.md" ] && grep -B2 -A60 "Variant ladder" "$OUT/seed/report.md" | head -90
fi

if has smoke; then
  wait_build
  stamp "== smoke: torch_ext"
  timeout 200 $PY -m harness run --op binary_backward --backend torch_ext --cases smoke \
    --json "$OUT/smoke-torch_ext.json" > "$OUT/smoke-torch_ext.log" 2>&1
  echo "exit $?"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/smoke-torch_ext.log" | head -20; tail -3 "$OUT/smoke-torch_ext.log"
fi

if has full; then
  wait_build
  stamp "== full: cupy@best and torch_ext"
  timeout "$FULL_LIMIT" $PY -m harness run --op binary_backward --backend cupy@best --backend torch_ext --cases full \
    --json "$OUT/full.json" > "$OUT/full.log" 2>&1
  echo "exit $? (124: stopped at FULL_LIMIT=$FULL_LIMIT s)"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/full.log" | head -40
  tail -3 "$OUT/full.log"
fi

if has bench; then
  wait_build
  stamp "== bench: perf cases"
  $PY -m harness bench --op binary_backward --backend torch --backend triton --backend cupy@opt --backend cupy@opt2 \
    --backend cupy@best --backend torch_ext --cases perf --budget "$BUDGET" --time-limit "$TIME_LIMIT" \
    --report "$OUT/bench" -q > "$OUT/bench.log" 2>&1
  echo "exit $?"; tail -4 "$OUT/bench.log"
  $PY - "$OUT/bench/results.json" > "$OUT/targets.txt" 2>&1 <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(f"{'case':55s} {'impl':12s} {'ms':>8s} {'host ms':>8s} {'% copy':>7s} {'x torch':>8s}  (bar: >= 88% of copy, "
      "host < device)")
for r in rows:
    if r["impl"] not in ("cupy@best", "torch_ext", "triton", "cupy@opt"):
        continue
    f = r.get("figures") or {}
    t = r.get("timing") or {}
    med, host = t.get("median"), t.get("host_ms")
    pct = f.get("pct_copy")
    miss = r["impl"] in ("cupy@best", "torch_ext") and pct is not None and pct < 88
    slow_host = med is not None and host is not None and host >= med
    print(f"{r['case']:55s} {r['impl']:12s} {med if med is None else round(med, 4)!s:>8s} "
          f"{host if host is None else round(host, 4)!s:>8s} "
          f"{'-' if pct is None else round(pct, 1)!s:>7s} {f.get('speedup_vs_baseline') or '-'!s:>8.6s}"
          f"{'  MISS' if miss else ''}{'  HOST' if slow_host else ''}")
PYEOF
  cat "$OUT/targets.txt" | grep -E "cupy@best|torch_ext" | head -80
  [ -f "$OUT/bench/report.md" ] && grep -A12 "(ref) vs" "$OUT/bench/report.md" | head -40
fi

if has profile; then
  stamp "== profile: cupy@best on two perf cases"
  mkdir -p "$OUT/profile"
  i=0
  for b in '[4096]' '[8,2048,1]'; do
    i=$((i + 1))
    case="{\"op\":\"binary_backward\",\"dtype\":\"bf16\",\"params\":{\"fn\":\"mul\",\"a\":[8,2048,4096],\"b\":$b}}"
    timeout 75 $PY -m harness profile --op binary_backward --backend cupy@best --case "$case" \
      --json "$OUT/profile/$i-cupy-best.json" > "$OUT/profile/$i-cupy-best.txt" 2>&1
    echo "profile $i exit $?"; tail -30 "$OUT/profile/$i-cupy-best.txt"
  done
fi

if has tune; then
  stamp "== tune: cupy@best under GRADORACLE_CUPY_BB settings"
  MULS=$($PY -c "
import json
from cases import select
print(json.dumps([c.to_json() for c in select('perf', op='binary_backward') if c.params['fn'] == 'mul']))")
  mkdir -p "$OUT/tune"
  for setting in default ur=1 ur=4 minblocks=2 ur=4,minblocks=2; do
    name=${setting//,/_}; name=${name//=/}
    env_setting=$setting; [ "$setting" = default ] && env_setting=
    GRADORACLE_CUPY_BB=$env_setting timeout 150 $PY -m harness bench --op binary_backward --backend cupy@best \
      --cases "$MULS" --budget 0.2 --report "$OUT/tune/$name" -q > "$OUT/tune/$name.log" 2>&1
    echo "$setting exit $?"
  done
  $PY - "$OUT/tune" > "$OUT/tune.txt" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
table = {}
names = []
for d in sorted(p for p in root.iterdir() if (p / "results.json").exists()):
    names.append(d.name)
    for r in json.load(open(d / "results.json"))["rows"]:
        if r["impl"] != "cupy@best":
            continue
        pct = (r.get("figures") or {}).get("pct_copy")
        table.setdefault(r["case"], {})[d.name] = "-" if pct is None else f"{pct:.1f}"
print(f"{'case (% of copy)':55s} " + " ".join(f"{n:>14s}" for n in names))
for case, row in table.items():
    print(f"{case:55s} " + " ".join(f"{row.get(n, '-'):>14s}" for n in names))
PYEOF
  cat "$OUT/tune.txt"
fi

wait_build
stamp "== done"
(cd "$OUT" && tar czf cupy_binary.tgz --exclude cupy_binary.tgz . 2>/dev/null); ls -la "$OUT" | head -30
