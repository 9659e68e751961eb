#!/usr/bin/env bash
# The bench figures of issue 11 (items 11-14) on a GPU: run from the repo root with $OUT a folder.
#   OUT=/some/dir scripts/gpu/bench_figures.sh
# 1. `harness bench` on the first perf case of every op but conv (--per-op 1) through torch, triton and
#    cupy (every variant; an op a backend lacks is a SKIP row), cold mode, small budgets; a second run
#    on one compute-bound conv case per conv op (torch); BENCHMARKS.md from both (`bench --from A --from B`);
# 2. checks that every timed row has the new figures: the loop figure (timing.loop_ms, loop_calls),
#    the host-bound mark (figures.host_bound), the binding ceiling (figures.binding, pct_binding;
#    compute-bound ops must show the matmul roof on at least one row), the peak extra memory
#    (timing.peak_extra_bytes for torch and cupy rows), no IMPOSSIBLE flag; and that report.md and
#    the regenerated BENCHMARKS.md carry the columns and the per-op markers;
# 3. prints a table op | impl | device ms | loop ms | host ms | bound | binding | peak extra.
# $OUT gets bench/ and bench_conv/ (results.json, report.md), BENCHMARKS.md (a copy of the repo's with
# the sections of these ops regenerated, hand-written text kept), bench.log, bench_conv.log, check.txt,
# loop_crosscheck.txt.
# Exit status: 0 when every check holds, 1 otherwise (check.txt says which).
# 4. times the rows of run A again with triton.testing.do_bench (scripts/gpu/loop_crosscheck.py):
#    where the host is the bottleneck do_bench should follow the loop figure, not the device time.
# About 4 minutes on an H100 (ceilings ~15 s, run A stops starting pairs after TIME_LIMIT=120 s,
# run B ~20 s, the cross-check ~30 s).
# Knobs: TIME_LIMIT=120 BUDGET=0.2 CASES=perf DEVICE=cuda (DEVICE=cpu CASES=smoke dry-runs the logic anywhere).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
: "${OUT:?set OUT to a folder for the results}"
TIME_LIMIT=${TIME_LIMIT:-120} BUDGET=${BUDGET:-0.2} DEVICE=${DEVICE:-cuda} CASES=${CASES:-perf}
WORK=$(mktemp -d /tmp/gradoracle-figures.XXXXXX)
export GRADORACLE_CACHE=$WORK/cache
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -2
stamp "== ceilings"
python3 -m harness ceilings --device "$DEVICE" 2>&1 | tail -2

cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
common=(--device "$DEVICE" --mode cold --budget "$BUDGET" --warmup-budget 0.1 --min-samples 10 --max-samples 500
        --no-plots)
stamp "== bench A: first $CASES case of each non-conv op (--per-op 1), torch + triton + cupy"
timeout $(( TIME_LIMIT + 120 )) python3 -m harness bench "${common[@]}" --cases "$CASES" --per-op 1 --interleave \
  --op attention_backward --op binary_backward --op layernorm_backward --op matmul_backward --op reduce_sum \
  --op rmsnorm_backward --backend torch --backend triton --backend cupy --time-limit "$TIME_LIMIT" \
  --report "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench A exit $?"
tail -3 "$OUT/bench.log"
# The first conv perf cases are single-channel 1D convolutions, memory-bound by their arithmetic
# intensity; this one (f32, 16 x 64 -> 64 channels, k=3: ~96 flop/byte) is over the f32 ridge.
CONV='{"dtype": "f32", "params": {"n": 16, "cin": 64, "cout": 64, "spatial": [65536], "kernel": [3], "stride": [1],
       "padding": [1], "dilation": [1], "groups": 1, "layout": "channels_first"}}'
[ "$CASES" = smoke ] && CONV='{"dtype": "f32", "params": {"n": 2, "cin": 16, "cout": 16, "spatial": [256],
       "kernel": [3], "stride": [1], "padding": [1], "dilation": [1], "groups": 1, "layout": "channels_first"}}'
python3 -c "import json, sys; c = json.loads(sys.argv[1]); json.dump([{**c, 'op': 'conv_backward_data'},
{**c, 'op': 'conv_backward_weight'}], open(sys.argv[2], 'w'))" "$CONV" "$WORK/conv.json"
stamp "== bench B: a compute-bound conv case per conv op, torch"
timeout 300 python3 -m harness bench "${common[@]}" --cases "$WORK/conv.json" --backend torch \
  --report "$OUT/bench_conv" > "$OUT/bench_conv.log" 2>&1
echo "bench B exit $?"
tail -3 "$OUT/bench_conv.log"
stamp "== BENCHMARKS.md from both runs (bench --from A --from B)"
python3 -m harness bench --from "$OUT/bench/results.json" --from "$OUT/bench_conv/results.json" \
  --benchmarks-md "$OUT/BENCHMARKS.md" 2>&1 | tail -1

stamp "== checks"
DEVICE=$DEVICE python3 - "$OUT" <<'EOF' 2>&1 | tee "$OUT/check.txt"
import json, os, sys
from pathlib import Path

out = Path(sys.argv[1])
cuda = os.environ.get("DEVICE", "cuda").startswith("cuda")
rows = [r for d in ("bench", "bench_conv") if (out / d / "results.json").exists()
        for r in json.loads((out / d / "results.json").read_text())["rows"]]
bad = []
print(f"{'op':22} {'impl':12} {'status':10} {'dev ms':>9} {'loop ms':>9} {'host ms':>9} {'bound':6} "
      f"{'binding':26} {'peak extra':>12}")
for r in rows:
    t, f = r.get("timing") or {}, r.get("figures") or {}
    if r["status"] == "SKIP":
        continue
    mib = None if t.get("peak_extra_bytes") is None else t["peak_extra_bytes"] / 2**20
    binding = f"{f.get('pct_binding', 0):.0f}% {f.get('binding')}" if f.get("pct_binding") is not None else "-"
    print(f"{r['op'][:22]:22} {r['impl'][:12]:12} {r['status'] + (' IMPOSS' if r.get('flag') else ''):10} "
          f"{t.get('median') or 0:9.4f} {t.get('loop_ms') or 0:9.4f} {t.get('host_ms') or 0:9.4f} "
          f"{'HOST' if f.get('host_bound') else '':6} {binding:26} "
          f"{'n/a' if mib is None else f'{mib:.2f} MiB':>12}")
    if r.get("flag"):
        bad.append(f"{r['op']} {r['impl']} {r['case']}: {r['flag']}")
        continue
    if r["status"] != "PASS":
        bad.append(f"{r['op']} {r['impl']} {r['case']}: {r['status']} {r.get('reason', '')[:200]}")
        continue
    need = {"loop_ms": t.get("loop_ms"), "loop_calls": t.get("loop_calls"), "binding": f.get("binding"),
            "pct_binding": f.get("pct_binding"), "host_bound": f.get("host_bound")}
    if cuda and r.get("framework") in ("torch", "cupy"):
        need["peak_extra_bytes"] = t.get("peak_extra_bytes")
    missing = [k for k, v in need.items() if v is None]
    if missing:
        bad.append(f"{r['op']} {r['impl']} {r['case']}: missing {', '.join(missing)}")
timed_ops = {r["op"] for r in rows if r["status"] == "PASS"}
for op in ("attention_backward", "conv_backward_data", "conv_backward_weight", "matmul_backward"):
    if op in timed_ops and not any(r["op"] == op and (r.get("figures") or {}).get("binding") == "matmul"
                                   for r in rows):
        bad.append(f"{op}: no row held to the matmul ceiling (its perf case should be compute-bound)")
missing_ops = sorted({r["op"] for r in rows} - timed_ops)
if missing_ops:
    bad.append(f"ops with no timed row: {', '.join(missing_ops)}")
report = (out / "bench" / "report.md").read_text() + (out / "bench_conv" / "report.md").read_text()
for col in ("| loop (ms) |", "| binding ceiling |", "| peak mem |"):
    if col not in report:
        bad.append(f"report.md lacks the column {col}")
bm = (out / "BENCHMARKS.md").read_text()
for op in sorted(timed_ops):
    if f"<!-- gradoracle:op {op} begin -->" not in bm:
        bad.append(f"BENCHMARKS.md lacks the section of {op}")
if "| case | bytes | impl | time (ms) | loop (ms) | binding ceiling | peak mem |" not in bm:
    bad.append("BENCHMARKS.md lacks the new table")
host = sum(1 for r in rows if (r.get("figures") or {}).get("host_bound"))
print(f"\n{sum(1 for r in rows if r['status'] == 'PASS')} timed rows over {len(timed_ops)} ops; {host} host-bound")
print("\n".join(["CHECKS FAILED:"] + ["  " + b for b in bad]) if bad else "ALL CHECKS PASSED")
sys.exit(1 if bad else 0)
EOF
rc=${PIPESTATUS[0]}
stamp "== loop figure against triton.testing.do_bench (informational)"
timeout 120 python3 scripts/gpu/loop_crosscheck.py "$OUT/bench/results.json" --device "$DEVICE" --max 12 \
  2>&1 | tee "$OUT/loop_crosscheck.txt"
stamp "done (exit $rc)"
rm -rf "$WORK"
exit "$rc"
