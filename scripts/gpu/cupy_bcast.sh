#!/usr/bin/env bash
# Issue 15, the three profiled misses of results/h100/bench-2 (binary_backward both-broadcast and
# bias patterns, reduce_sum of a transposed input): the GPU batch for the new @best device code.
#   OUT=/some/dir bash scripts/gpu/cupy_bcast.sh          (about 8 minutes on an H100; STEPS splits it)
# Steps (STEPS, any subset; default all, in this order):
#   prep     pip install -e (no deps); plans.txt: registers / local bytes / blocks per SM of the
#            changed kernels (bb_batch, bb_cols, bb_rows, rs_row_team, rs_col) and @best's plan of
#            the changed perf cases.
#   full     harness run --cases full, binary_backward (1294 cases) and reduce_sum (157), cupy@best,
#            in 6 shards side by side (FULL_LIMIT s each; SIGTERM keeps what finished) -> full-K.json /
#            full-K.log, full.txt (counts, failures).  The bench below re-validates the perf cases.
#   bench    harness bench on scripts/gpu/cases/cupy_bcast.json (18 perf cases: the bench-2 misses
#            of binary_backward's bias / row-sum / both-broadcast patterns and of reduce_sum):
#            cupy@best, triton, torch -> bench/; then cupy@best built and planned as before as far
#            as switches reach (GRADORACLE_CUPY_BB=legacy=1,pf=0,colsur=2,colsminblocks=3: bb_batch's
#            y-looped mode, no L2 prefetch, bb_cols at 2 rows / 3 blocks; GRADORACLE_CUPY_RS=
#            teamblocks=1,colblocks=1: no new register bounds) -> bench-old/; targets.txt: % of copy,
#            new vs old vs triton (bars 88% / 92%).
#   tune     cupy@best on scripts/gpu/cases/cupy_bcast_tune.json (7 cases) under other settings
#            (TUNE_SETTINGS; default pf=0: no L2 prefetch; "colsur=2,colsminblocks=3": bb_cols at 2
#            rows / 3 blocks with the prefetch; yg=2: bb_both (once bb_batch's stream mode) loads 2 rows of g before
#            use; worth a later run: pf=4, "ur=1,minblocks=4")
#            -> tune/<name>/, tune.txt (with the default and old columns from bench).
#   profile  python -m harness profile, cupy@best, the three cases of the issue -> profile/*.txt|json
# Knobs: PY=python3 BUDGET=0.1 TIME_LIMIT=90 (bench, s) FULL_LIMIT=100 (s per shard) TUNE_SETTINGS.
# Everything lands under $OUT (tarred into $OUT/cupy_bcast.tgz at the end).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PY:-python3} STEPS=${STEPS:-prep full bench tune profile}
BUDGET=${BUDGET:-0.1} TIME_LIMIT=${TIME_LIMIT:-90} FULL_LIMIT=${FULL_LIMIT:-100}
TUNE_SETTINGS=${TUNE_SETTINGS:-pf=0 colsur=2,colsminblocks=3 yg=2}
CASES=scripts/gpu/cases/cupy_bcast.json TUNE=scripts/gpu/cases/cupy_bcast_tune.json
OLD_BB="legacy=1,pf=0,colsur=2,colsminblocks=3" OLD_RS="teamblocks=1,colblocks=1"
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
BENCH=(--budget "$BUDGET" --warmup-budget 0.05 --min-samples 10 --max-samples 200 --no-plots -q)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  git log --oneline -1
} 2>&1 | tee "$OUT/env.txt"

if has prep; then
  stamp "== prep: install, kernels, plans"
  pip install -q -e . --no-deps --no-build-isolation > "$OUT/pip.log" 2>&1; echo "pip exit $?"
  timeout 120 $PY - > "$OUT/plans.txt" 2>&1 <<'PYEOF'
import json
from backends._plans import binary_backward_cuda as cp
from backends.cupy import binary_backward as bb
from backends.cupy import reduce_sum as rs
from cases import select

dev = bb.CupyDevice()
print(f"SMs {dev.num_sms()}")
for dt in ("bf16", "f32"):
    for fn in ("mul", "div"):
        for k in ("batch", "cols", "rows"):
            expr = bb.kernel_expr(k, dt, fn, True)
            f = bb._function(expr)
            print(f"{expr:40s} regs {f.num_regs:3d} local {f.local_size_bytes:4d} B smem {f.shared_size_bytes:5d} B "
                  f"blocks/SM {dev.blocks_per_sm(expr)}")
rdev = rs.device()
for dt in ("bf16", "f32"):
    for k, simple in (("row_team", False), ("row_team", True), ("row_block", False), ("col", True), ("col", False)):
        expr = rs.kernel_expr(k, dt, True, simple)
        f = rs.kernel(expr)
        print(f"{expr:44s} regs {f.num_regs:3d} local {f.local_size_bytes:4d} B blocks/SM {rdev.occupancy(expr)}")
print()
for c in json.load(open("scripts/gpu/cases/cupy_bcast.json"))["cases"]:
    if c["op"] != "binary_backward":
        continue
    a, b, dt, fn = tuple(c["params"]["a"]), tuple(c["params"]["b"]), c["dtype"], c["params"]["fn"]
    o = cp.bcast.broadcast_shape(a, b)
    st = cp.bcast.contiguous_strides
    for legacy in (False, True):
        la = bb.build_entry("best", dt, fn, ((a, st(a)), (b, st(b)), (o, st(o))), (0,) * 5, dev.num_sms(),
                            dev.blocks_per_sm, legacy=legacy).launch
        w = la.words[-12:] if la.words else None
        print(f"{fn}[{dt},A={a},B={b}]{' legacy' if legacy else '':7s} {la.kind:6s} vec={int(la.vectorized)} "
              f"grid={la.grid:5d} lanes={w[0] if w else '-'} chunk={w[2:5] if w else '-'} ntiles={w[8] if w else '-'} "
              f"chunks={la.nchunks}")
PYEOF
  echo "exit $?"; cat "$OUT/plans.txt" | head -90
fi

if has full; then
  stamp "== full: cupy@best, binary_backward + reduce_sum, 6 shards"
  for k in 0 1 2 3 4 5; do
    timeout -k 15 -s TERM "$FULL_LIMIT" $PY -m harness run --op binary_backward --op reduce_sum --backend cupy@best \
      --cases full --shard "$k/6" --json "$OUT/full-$k.json" > "$OUT/full-$k.log" 2>&1 &
  done
  wait
  for k in 0 1 2 3 4 5; do echo "shard $k: $(tail -1 "$OUT/full-$k.log")"; done | tee "$OUT/full.txt"
  grep -hE "^(FAIL|ERROR|CRASH)" -A3 "$OUT"/full-*.log | head -60 | tee -a "$OUT/full.txt"
fi

if has bench; then
  stamp "== bench: new cupy@best, triton, torch"
  timeout $((TIME_LIMIT + 90)) $PY -m harness bench --backend cupy@best --backend triton --backend torch --cases "$CASES" \
    --time-limit "$TIME_LIMIT" "${BENCH[@]}" --report "$OUT/bench" > "$OUT/bench.log" 2>&1
  echo "exit $?"; tail -3 "$OUT/bench.log"
  stamp "== bench: cupy@best as before ($OLD_BB / $OLD_RS)"
  GRADORACLE_CUPY_BB=$OLD_BB GRADORACLE_CUPY_RS=$OLD_RS timeout 110 $PY -m harness bench --backend cupy@best \
    --cases "$CASES" --time-limit 50 "${BENCH[@]}" --report "$OUT/bench-old" > "$OUT/bench-old.log" 2>&1
  echo "exit $?"; tail -3 "$OUT/bench-old.log"
  $PY - "$OUT" > "$OUT/targets.txt" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
pct = {}
for tag in ("bench", "bench-old"):
    f = root / tag / "results.json"
    if not f.exists():
        continue
    for r in json.load(open(f))["rows"]:
        p = (r.get("figures") or {}).get("pct_copy")
        ms = (r.get("timing") or {}).get("median")
        name = r["impl"] + ("(old)" if tag == "bench-old" else "")
        pct.setdefault((r["op"], r["case"]), {})[name] = (p, ms)
cols = ("cupy@best", "cupy@best(old)", "triton", "torch")
print(f"{'op':15s} {'case':50s} " + " ".join(f"{c:>22s}" for c in cols) + "   (% copy / ms; bar 88% binary, 92% reduce)")
for (op, case), row in pct.items():
    bar = 92 if op == "reduce_sum" else 88
    cells = []
    for c in cols:
        p, ms = row.get(c, (None, None))
        cells.append(f"{'-' if p is None else f'{p:.1f}'} / {'-' if ms is None else f'{ms:.4f}'}")
    p = row.get("cupy@best", (None,))[0]
    print(f"{op:15s} {case:50s} " + " ".join(f"{x:>22s}" for x in cells) + ("  MISS" if p is not None and p < bar else ""))
PYEOF
  cat "$OUT/targets.txt"
fi

if has tune; then
  stamp "== tune: cupy@best settings on the key cases"
  mkdir -p "$OUT/tune"
  for setting in $TUNE_SETTINGS; do
    name=${setting//,/_}; name=${name//=/}
    GRADORACLE_CUPY_BB=$setting timeout 60 $PY -m harness bench --backend cupy@best --cases "$TUNE" --time-limit 28 \
      "${BENCH[@]}" --report "$OUT/tune/$name" > "$OUT/tune/$name.log" 2>&1
    echo "$setting exit $?"
  done
  $PY - "$OUT" > "$OUT/tune.txt" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
runs = {"default": root / "bench", "old": root / "bench-old"}
runs.update({d.name: d for d in sorted((root / "tune").iterdir()) if d.is_dir()})
table = {}
for name, d in runs.items():
    f = d / "results.json"
    if not f.exists():
        continue
    for r in json.load(open(f))["rows"]:
        if r["impl"] == "cupy@best":
            p = (r.get("figures") or {}).get("pct_copy")
            table.setdefault(r["case"], {})[name] = "-" if p is None else f"{p:.1f}"
print(f"{'case (% of copy)':52s} " + " ".join(f"{n:>14s}" for n in runs))
for case, row in table.items():
    if len(row) > 2:
        print(f"{case:52s} " + " ".join(f"{row.get(n, '-'):>14s}" for n in runs))
PYEOF
  cat "$OUT/tune.txt"
fi

if has profile; then
  stamp "== profile: cupy@best, the issue's three cases"
  mkdir -p "$OUT/profile"
  i=0
  while IFS='|' read -r op case; do
    i=$((i + 1))
    timeout 75 $PY -m harness profile --op "$op" --backend cupy@best --case "$case" \
      --json "$OUT/profile/$i-$op.json" > "$OUT/profile/$i-$op.txt" 2>&1
    echo "profile $i exit $?"; tail -16 "$OUT/profile/$i-$op.txt"
  done <<'EOF'
binary_backward|{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}
binary_backward|{"op":"binary_backward","dtype":"bf16","params":{"fn":"div","a":[8,2048,4096],"b":[4096]}}
reduce_sum|{"op":"reduce_sum","dtype":"bf16","params":{"shape":[8,2048,4096],"target":[4096],"x_layout":"transposed"}}
EOF
fi

stamp "== done"
(cd "$OUT" && tar czf cupy_bcast.tgz --exclude cupy_bcast.tgz . 2>/dev/null); ls -la "$OUT" | head -30
