#!/usr/bin/env bash
# The triton attention_backward (triton = atomic dq, triton@det = deterministic dq) on one H100:
#   OUT=/some/dir scripts/gpu/triton_attn.sh            (from the repo root; at most about 9 minutes)
# The default runs every step with short limits; for the whole picture run it twice:
#   OUT=/o1 STEPS="probe full repeat" FULL_S=300 scripts/gpu/triton_attn.sh              (~8 min)
#   OUT=/o2 STEPS=bench BENCH_S=500 scripts/gpu/triton_attn.sh                          (~9 min)
# Steps (STEPS="probe full repeat bench" by default; any subset, in that order), each under its
# own time limit (killed with SIGINT, so the harness still writes its JSON checkpoint):
#   probe   per perf shape (a few llama and FA-grid ones): the autotuner's candidates and timings,
#           registers / spills / shared memory of each launch, device ms and TFLOP/s of both
#           variants, host ms per unchecked call         -> probe.json, probe.log         (<= 90 s)
#   full    harness run --op attention_backward --backend triton --backend triton@det --cases full,
#           FULL_JOBS shards in parallel (compiles are CPU-bound; the GPU is shared)
#           -> full-K.json, full-K.log                                           (<= FULL_S = 210 s)
#   repeat  harness run --backend triton@det --cases full --dtype bf16 --repeat 5: bitwise equal
#           outputs over 5 calls (deterministic=True) -> repeat.json, repeat.log        (<= 60 s)
#   bench   harness bench --cases perf: triton, triton@det, sdpa_flash, sdpa_cudnn, torch
#           -> bench/{results.json,report.md}, bench.log, and $OUT/summary.txt: TFLOP/s per
#           case and the ratios to sdpa_flash and sdpa_cudnn (no new pair starts after
#           BENCH_S - 30 s; the cases run in the perf order, llama shapes first)     (<= BENCH_S = 120 s)
# Files: $OUT/run.log, $OUT/summary.txt and $OUT/triton_attn.tgz (everything else, under res/).
# Knobs: PYTHON=python3 STEPS=... FULL_JOBS=4 FULL_S=210 BENCH_S=120 BUDGET=0.2
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-probe full repeat bench} FULL_JOBS=${FULL_JOBS:-4}
FULL_S=${FULL_S:-210} BENCH_S=${BENCH_S:-120} BUDGET=${BUDGET:-0.2}
mkdir -p "$OUT/res"
R=$OUT/res
exec > >(tee "$OUT/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

stamp "== setup"
$PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if has probe; then
  stamp "== probe (tuning, resources, device and host time per perf shape)"
  timeout -k 15 -s INT 90 $PY - "$R/probe.json" <<'EOF' 2>&1 | tee "$R/probe.log"
import json, sys, time
import torch
from backends.triton import attention_backward as ab

def inputs(b, s, hq, hkv, d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *sh: torch.randn(*sh, device="cuda", dtype=torch.bfloat16, generator=g)
    x = {"q": r(b, s, hq, d), "k": r(b, s, hkv, d), "v": r(b, s, hkv, d), "o": r(b, s, hq, d), "do": r(b, s, hq, d),
         "lse": torch.full((b, hq, s), 8.0, device="cuda")}
    outs = {n: torch.empty_like(x[m]) for n, m in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    return x, outs, {"B": b, "Sq": s, "Sk": s, "Hq": hq, "Hkv": hkv, "D": d, "causal": causal}

def ms(fn, reps=10):
    fn(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record(); e1.synchronize()
    return e0.elapsed_time(e1) / reps

shapes = [(1, 4096, 32, 8, 128, True), (2, 8192, 16, 16, 128, False), (4, 4096, 16, 16, 128, True),
          (8, 2048, 32, 32, 64, False), (2, 8192, 32, 32, 64, True), (1, 4096, 8, 8, 256, True)]
out = []
for b, s, hq, hkv, d, causal in shapes:
    x, outs, p = inputs(b, s, hq, hkv, d, causal)
    pairs = s * (s + 1) // 2 if causal else s * s
    flops = 2.5 * 4 * b * hq * d * pairs
    row = {"shape": [b, s, hq, hkv, d, causal]}
    for variant, fn in (("triton", ab.attention_backward), ("triton@det", ab.attention_backward_det)):
        try:
            t = time.perf_counter(); fn(x, outs, p); torch.cuda.synchronize()
            first = time.perf_counter() - t
            dev = ms(lambda: fn.unchecked(x, outs, p))
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(50):
                fn.unchecked(x, outs, p)
            host = (time.perf_counter() - t) / 50 * 1e3   # launches queue behind the GPU: host-bound only if < dev
            plan = next(pl for k, pl in ab._PLANS.items() if k[0] == ("default" if variant == "triton" else "det")
                        and tuple(k[3]) == (b, s, hq, d) and k[14] == causal)
            res = [{"kernel": L.kernel.__name__ if hasattr(L.kernel, "__name__") else str(L.kernel),
                    "regs": getattr(L.compiled, "n_regs", None), "spills": getattr(L.compiled, "n_spills", None),
                    "shared": getattr(getattr(L.compiled, "metadata", None), "shared", None)} for L in plan.launches()]
            row[variant] = {"ms": dev, "tflops": flops / dev / 1e9, "first_call_s": first, "host_ms_per_call": host,
                            "config": str(plan.cfg), "split": plan.split, "launches": res}
        except Exception as exc:  # noqa: BLE001
            row[variant] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps({variant: row[variant], "shape": row["shape"]}), flush=True)
    out.append(row)
    del x, outs
    torch.cuda.empty_cache()
tuning = {str(k): {"chosen": v["chosen"], "tried": [{kk: str(vv) for kk, vv in t.items()} for t in v["tried"]]}
          for k, v in ab.TUNING_LOG.items()}
print(json.dumps(tuning, indent=1))
json.dump({"rows": out, "tuning": tuning}, open(sys.argv[1], "w"), indent=1)
EOF
  echo "exit ${PIPESTATUS[0]}"
fi

if has full; then
  stamp "== full: $FULL_JOBS shards of harness run --op attention_backward --backend triton --backend triton@det --cases full"
  pids=()
  for ((i = 0; i < FULL_JOBS; i++)); do
    timeout -k 15 -s INT "$FULL_S" $PY -m harness run --op attention_backward --backend triton --backend triton@det \
      --cases full --device cuda --shard "$i/$FULL_JOBS" --json "$R/full-$i.json" > "$R/full-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; echo "shard exit $?"; done
  for ((i = 0; i < FULL_JOBS; i++)); do tail -2 "$R/full-$i.log"; done
  echo "statuses:"; cat "$R"/full-*.log | awk '$2 == "attention_backward" {print $1, $3}' | sort | uniq -c
  grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$R"/full-*.log | head -30
fi

if has repeat; then
  stamp "== repeat: triton@det, bf16 full cases, 5 calls each must be bitwise equal"
  timeout -k 15 -s INT 60 $PY -m harness run --op attention_backward --backend triton@det --cases full --dtype bf16 \
    --device cuda --repeat 5 --json "$R/repeat.json" > "$R/repeat.log" 2>&1
  echo "exit $?"; tail -2 "$R/repeat.log"
  awk '$2 == "attention_backward" {print $1}' "$R/repeat.log" | sort | uniq -c
  grep -hE "^(FAIL|ERROR|CRASH)" "$R/repeat.log" | head -10
fi

if has bench; then
  stamp "== bench: perf cases, triton, triton@det, sdpa_flash, sdpa_cudnn, torch"
  $PY -m harness bench --op attention_backward --backend triton --backend triton@det --backend sdpa_flash \
    --backend sdpa_cudnn --backend torch --cases perf --device cuda --budget "$BUDGET" \
    --time-limit "$((BENCH_S - 30))" --report "$R/bench" --no-plots > "$R/bench.log" 2> "$R/bench.err"
  echo "exit $?"; tail -3 "$R/bench.err"
  stamp "== summary -> $OUT/summary.txt"
  $PY scripts/gpu/tflops_table.py "$R/bench/results.json" --impl triton --impl triton@det --impl sdpa_flash \
    --impl sdpa_cudnn --impl torch --ratio triton/sdpa_flash --ratio triton/sdpa_cudnn --ratio triton@det/sdpa_flash \
    --host triton | tee "$OUT/summary.txt"
fi
stamp "== pack"
tar -czf "$OUT/triton_attn.tgz" -C "$OUT" res && rm -rf "$R"
stamp "== done"
