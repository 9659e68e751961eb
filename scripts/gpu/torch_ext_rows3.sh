#!/usr/bin/env bash
# torch_ext with nb_rows3 (cupy@best's norms kernel) for layernorm_backward / rmsnorm_backward: the
# GPU batch before the extension's default flips from kernel=rows to kernel=rows3.  nb_rows3 is
# built into the extension (norm_backward_cuda.h) and chosen by GRADORACLE_TORCH_EXT_NORMS=kernel=rows3;
# the CPU checks passed (nvcc -Xptxas -v: <= 64 registers, no spills, every instantiation the
# planner names; the records' tests) but it has never run through the extension on a GPU.
# Run from the repo root on a CUDA machine:
#     OUT=/some/dir bash scripts/gpu/torch_ext_rows3.sh
#
#  0. install (editable, no deps), build the extension with its CUDA sources (`harness list`)
#                                                                   -> build.log, env.txt
#  1. GRADORACLE_TORCH_EXT_NORMS=kernel=rows3: torch_ext on the full sets of both ops, 4 shards in
#     parallel (--shard k/4, each under SHARD_LIMIT s)               -> full-k.{json,log}
#  2. `harness bench` on the norms perf cases in two processes: torch_ext with the default
#     (kernel=rows) beside cupy@best, then torch_ext with kernel=rows3 beside cupy@best again (the
#     reference for drift between the processes); no pair started after BENCH_LIMIT s
#                                                                   -> bench-rows/, bench-rows3/
#  3. a table per case: median us and % of copy of torch_ext rows, rows3, cupy@best (ab.txt)
# Everything in $OUT/torch_ext_rows3.tgz (summary.txt in it, and on stdout).  About 8 minutes on an H100
# (build about 3.5 min: nb_rows3 adds 92 instantiations; the build folder build/torch_ext/<hash>
# is kept, so a second run on a warm machine skips it).  Knobs: SHARD_LIMIT=150 BENCH_LIMIT=40
# BUDGET=0.1 (s per pair) SKIP_FULL=1 SKIP_BENCH=1.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
SHARD_LIMIT=${SHARD_LIMIT:-150} BENCH_LIMIT=${BENCH_LIMIT:-40} BUDGET=${BUDGET:-0.1}
SKIP_FULL=${SKIP_FULL:-0} SKIP_BENCH=${SKIP_BENCH:-0} PY=${PY:-python3}
unset GRADORACLE_TORCH_EXT_NORMS GRADORACLE_CUPY_NORMS
W="$OUT/work"
mkdir -p "$W"
t0=$(date +%s)
S="$W/summary.txt"
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }
OPS=(--op layernorm_backward --op rmsnorm_backward)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -2
  git log -1 --format='commit %H %s' 2>/dev/null
} > "$W/env.txt" 2>&1
cat "$W/env.txt" >> "$S"

stamp "== 0. install, build (harness list)"
$PY -m pip install -q -e . --no-deps --no-build-isolation > "$W/pip.log" 2>&1; echo "pip exit $?" | tee -a "$S"
timeout -k 15 330 $PY -m harness list > "$W/build.log" 2>&1; echo "list exit $?" | tee -a "$S"
$PY -c "from backends import torch_ext; print('torch_ext cuda:', torch_ext._check('cuda') or 'available')" 2>&1 \
  | tee -a "$S"

if [ "$SKIP_FULL" != 1 ]; then
  stamp "== 1. kernel=rows3: torch_ext on the full sets, 4 shards in parallel"
  for k in 0 1 2 3; do
    GRADORACLE_TORCH_EXT_NORMS=kernel=rows3 timeout -k 15 "$SHARD_LIMIT" $PY -m harness run "${OPS[@]}" \
      --backend torch_ext --cases full --device cuda --shard "$k/4" --json "$W/full-$k.json" > "$W/full-$k.log" 2>&1 &
  done
  for k in 0 1 2 3; do
    wait -n; echo "a shard exited $?" | tee -a "$S"
  done
  for k in 0 1 2 3; do
    echo "-- shard $k: $(tail -1 "$W/full-$k.log")" >> "$S"
    grep -E "^(FAIL|ERROR|CRASH|TIMEOUT)" -A3 "$W/full-$k.log" | head -30 >> "$S"
  done
fi

if [ "$SKIP_BENCH" != 1 ]; then
  bench_args=(--cases perf --device cuda --budget "$BUDGET" --warmup-budget 0.05 --interleave
              --time-limit "$BENCH_LIMIT" --no-plots -q)
  stamp "== 2a. bench: torch_ext (default, kernel=rows) and cupy@best"
  timeout -k 15 $((BENCH_LIMIT + 60)) $PY -m harness bench "${OPS[@]}" --backend torch_ext --backend cupy@best \
    "${bench_args[@]}" --report "$W/bench-rows" > "$W/bench-rows.log" 2>&1
  echo "exit $?" | tee -a "$S"; tail -3 "$W/bench-rows.log" >> "$S"
  stamp "== 2b. bench: torch_ext with kernel=rows3 and cupy@best"
  GRADORACLE_TORCH_EXT_NORMS=kernel=rows3 timeout -k 15 $((BENCH_LIMIT + 60)) $PY -m harness bench "${OPS[@]}" \
    --backend torch_ext --backend cupy@best "${bench_args[@]}" --report "$W/bench-rows3" > "$W/bench-rows3.log" 2>&1
  echo "exit $?" | tee -a "$S"; tail -3 "$W/bench-rows3.log" >> "$S"

  stamp "== 3. A/B table"
  $PY - "$W" > "$W/ab.txt" 2>&1 <<'PYEOF'
import json, statistics, sys
from pathlib import Path

w = Path(sys.argv[1])
cols = (("bench-rows", "torch_ext", "rows"), ("bench-rows3", "torch_ext", "rows3"), ("bench-rows", "cupy@best", "cupy_A"),
        ("bench-rows3", "cupy@best", "cupy_B"))
data = {}
for folder, impl, name in cols:
    try:
        rows = json.loads((w / folder / "results.json").read_text())["rows"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{folder}: no results ({e})")
        continue
    for r in rows:
        if r.get("impl") == impl:
            fig = r.get("figures") or {}
            data.setdefault((r["op"], r["case"]), {})[name] = (r["status"], r.get("time_ms"), fig.get("pct_copy"))
names = [c[2] for c in cols]
print(f"{'op':20s} {'case':40s} " + " ".join(f"{n + ' us / %copy':>22s}" for n in names) + "  rows3/rows")
ratios = {"layernorm_backward": [], "rmsnorm_backward": []}
for (op, case), got in sorted(data.items()):
    cells = []
    for n in names:
        st, ms, pct = got.get(n, ("-", None, None))
        cells.append(f"{st:>5s} {ms * 1e3:8.1f} {pct:5.1f}%" if ms and pct is not None else f"{st:>22s}")
    a, b = got.get("rows"), got.get("rows3")
    ratio = ""
    if a and b and a[1] and b[1] and a[0] == b[0] == "PASS":
        ratios[op].append(a[1] / b[1])
        ratio = f"{a[1] / b[1]:.3f}x"
    print(f"{op:20s} {case:40s} " + " ".join(f"{c:>22s}" for c in cells) + f"  {ratio}")
for op, rs in ratios.items():
    if rs:
        print(f"{op}: speedup of rows3 over rows: median {statistics.median(rs):.3f}x, min {min(rs):.3f}x, "
              f"max {max(rs):.3f}x over {len(rs)} cases")
PYEOF
  echo "exit $?" | tee -a "$S"; cat "$W/ab.txt" >> "$S"
fi

stamp "done"
tar -C "$W" -czf "$OUT/torch_ext_rows3.tgz" . && rm -rf "$W"
