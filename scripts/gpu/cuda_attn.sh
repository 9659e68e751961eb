#!/usr/bin/env bash
# The cupy attention_backward kernels (backends/cuda/attention_backward.cuh: cupy@fa2 = cupy@best,
# atomic dq; cupy@fa2_det, deterministic dq) on one H100:
#   OUT=/some/dir scripts/gpu/cuda_attn.sh            (from the repo root; about 8 minutes at most)
# Steps (STEPS="warm smoke full repeat bench" by default; any subset, in that order), each under its
# own time limit (SIGINT: the harness still writes its JSON checkpoint):
#   (setup) the torch_ext build starts in the background (MAX_JOBS=16, CUDA_HOME=/usr/local/cuda,
#           TORCH_CUDA_ARCH_LIST=9.0; ~2.5 min) -> torch_ext_build.log; full and bench wait for it
#   warm    NVRTC-compile every instantiation (4 processes, one per dtype; cupy caches the cubins on
#           disk for the later steps), then per perf shape (llama GQA causal, FA grid, D=256, decoding)
#           every tuning candidate's device ms and TFLOP/s, registers / local (spill) bytes / shared
#           memory per kernel, the tuner's choice and host ms per unchecked call
#           -> warm-*.log, probe.json, probe.log             (<= WARM_S = 70 s + PROBE_S = 60 s)
#   smoke   harness run --cases smoke, cupy@fa2, cupy@fa2_det, cupy (= best)     -> smoke.{json,log} (<= 45 s)
#   full    harness run --cases full, cupy@fa2, cupy@fa2_det and torch_ext, FULL_JOBS shards side by side
#           (scripts/gpu_parallel_run.sh, job file written here)      -> full/{summary.txt,runs.tar.gz}
#                                                                                 (<= FULL_S = 150 s)
#   repeat  cupy@fa2_det --repeat 50 on scripts/gpu/cases/cuda_attn_repeat.json: bitwise equal
#           outputs over 50 calls (deterministic=True)                 -> repeat.{json,log} (<= 40 s)
#   bench   harness bench --cases perf (cold L2): cupy, cupy@fa2_det, torch_ext, sdpa_flash, sdpa_cudnn, triton
#           -> bench/{results.json,report.md}, bench.log and $OUT/summary.txt: TFLOP/s per case and
#           the ratios of cupy (fa2) to sdpa_flash and sdpa_cudnn        (<= BENCH_S = 100 s)
# The default fits about 8 minutes; the full set may not finish in FULL_S = 150 s (the float64 oracle
# of the 1k-token cases is CPU-bound).  For every full case: OUT=/o2 STEPS=full FULL_S=480 FULL_JOBS=12.
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/cuda_attn.tgz (everything else, under res/).
# Knobs: BENCH_ARGS (more harness bench options, e.g. "--dtype bf16") PYTHON=python3 STEPS=... FULL_JOBS=6 WARM_S=70 PROBE_S=60 FULL_S=150 BENCH_S=100 BUDGET=0.2
#        GRADORACLE_CUPY_ATTN_TUNE=0 (no tuning: the default tiles), GRADORACLE_CUPY_ATTN_CFG=main=64x64x1
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one torch_ext build digest for every process
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-warm smoke full repeat bench} FULL_JOBS=${FULL_JOBS:-6}
WARM_S=${WARM_S:-70} PROBE_S=${PROBE_S:-60} FULL_S=${FULL_S:-150} BENCH_S=${BENCH_S:-100} BUDGET=${BUDGET:-0.2}
mkdir -p "$OUT/res"
R=$OUT/res
exec > >(tee "$OUT/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
statuses() { awk '$2 == "attention_backward" {print $1, $3}' "$@" | sort | uniq -c; }

stamp "== setup"
timeout 120 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
$PY -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
stamp "== torch_ext build (background)"
( export MAX_JOBS=${MAX_JOBS:-16} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  timeout 400 $PY -c "from backends import torch_ext; print('torch_ext cuda:', torch_ext._check('cuda'))" ) \
  > "$R/torch_ext_build.log" 2>&1 &
build_pid=$!
ext_ready() {  # waits for the build; prints why torch_ext is left out, if it is
  wait "$build_pid" 2>/dev/null
  if grep -q "torch_ext cuda: None" "$R/torch_ext_build.log"; then EXT=1; else EXT=0; echo "torch_ext left out:"; tail -3 "$R/torch_ext_build.log"; fi
}

if has warm; then
  stamp "== warm: NVRTC compiles (one process per dtype)"
  for dt in bf16 f16 f32 f64; do
    timeout -k 15 -s INT "$WARM_S" $PY - "$dt" > "$R/warm-$dt.log" 2>&1 <<'EOF' &
import sys, time
from backends.cupy import attention_backward as A
dt = sys.argv[1]
dev = A.device()
seen = set()
for variant in ("fa2", "fa2_det"):
    for d in (64, 128, 256, 40):
        for cfg, split in [(c, s) for c in A.candidates(variant, dt, d) for s in ((1, 2) if c else (1,))]:
            for launch in A._launches(variant, dt, (1, 1, 1, 2, 1, d), cfg, split):
                if launch.expr in seen:
                    continue
                seen.add(launch.expr)
                t = time.perf_counter()
                fn = dev.function(launch)
                at = fn.attributes
                print(f"{launch.expr:60s} {time.perf_counter() - t:6.1f}s regs {at.get('num_regs')} "
                      f"local {at.get('local_size_bytes')} B smem {launch.smem} B", flush=True)
EOF
  done
  wait
  tail -n 40 "$R"/warm-*.log
  stamp "== probe: tuning candidates per perf shape"
  timeout -k 15 -s INT "$PROBE_S" $PY - "$R/probe.json" <<'EOF' 2>&1 | tee "$R/probe.log"
import json, sys, time
import cupy, ml_dtypes, numpy as np
from backends.cupy import attention_backward as A

def inputs(b, sq, sk, hq, hkv, d, causal):
    rng = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    r = lambda *sh: cupy.asarray(rng.standard_normal(sh, dtype=np.float32).astype(bf))
    x = {"q": r(b, sq, hq, d), "k": r(b, sk, hkv, d), "v": r(b, sk, hkv, d), "o": r(b, sq, hq, d),
         "do": r(b, sq, hq, d), "lse": cupy.full((b, hq, sq), 8.0, dtype=cupy.float32)}
    outs = {"dq": cupy.empty_like(x["q"]), "dk": cupy.empty_like(x["k"]), "dv": cupy.empty_like(x["v"])}
    return x, outs, {"B": b, "Sq": sq, "Sk": sk, "Hq": hq, "Hkv": hkv, "D": d, "causal": causal}

shapes = [(1, 2048, 2048, 32, 8, 128, True), (1, 4096, 4096, 64, 8, 128, True), (2, 8192, 8192, 16, 16, 128, False),
          (8, 2048, 2048, 32, 32, 64, False), (1, 4096, 4096, 8, 8, 256, True), (1, 1, 8192, 32, 8, 128, False)]
dev = A.device()
rows = []
for b, sq, sk, hq, hkv, d, causal in shapes:
    x, outs, p = inputs(b, sq, sk, hq, hkv, d, causal)
    pairs = sum(min(i + sk - sq, sk - 1) + 1 for i in range(sq)) if causal else sq * sk
    flops = 2.5 * 4 * b * hq * d * pairs
    row = {"shape": [b, sq, sk, hq, hkv, d, causal]}
    tensors = {**x, **outs}
    strides = {n: A.element_strides(t) for n, t in tensors.items()}
    for variant in ("fa2", "fa2_det"):
        tried = []
        cands = A.candidates(variant, "bf16", d)
        for cfg, sms in [(c, dev.num_sms()) for c in cands] + [(cands[0], None)]:  # the last: no head split
            try:
                pl = A.plan(variant, "bf16", (b, sq, sk, hq, hkv, d), strides, True, p, cfg, sms)
                ms = dev.time_ms(lambda: A.run(dev, pl, tensors), reps=5)
                tried.append({"cfg": str(cfg), "split": pl.words[-1], "ms": ms, "tflops": flops / ms / 1e9})
            except Exception as exc:  # noqa: BLE001
                tried.append({"cfg": str(cfg), "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(json.dumps({"shape": row["shape"], "variant": variant, **tried[-1]}), flush=True)
        fn = {"fa2": A.attention_backward_fa2, "fa2_det": A.attention_backward_fa2_det}[variant]
        t = time.perf_counter(); fn(x, outs, p); cupy.cuda.Device().synchronize(); first = time.perf_counter() - t
        cupy.cuda.Device().synchronize(); t = time.perf_counter()
        for _ in range(20):
            fn.unchecked(x, outs, p)
        cupy.cuda.Device().synchronize()
        host = (time.perf_counter() - t) / 20 * 1e3
        chosen = next((str(v) for k, v in A._TUNED.items() if k[0] == variant and k[2] == (b, sq, sk, hq, hkv, d)), "default")
        row[variant] = {"tried": tried, "chosen": chosen, "first_call_s": first, "ms_per_call_incl_host": host}
        print(json.dumps({"shape": row["shape"], "variant": variant, "chosen": chosen, "first_call_s": first,
                          "ms_per_call_incl_host": host}), flush=True)
    rows.append(row)
    del x, outs, tensors
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
EOF
  echo "exit ${PIPESTATUS[0]}"
fi

if has smoke; then
  stamp "== smoke: cupy@fa2, cupy@fa2_det, cupy"
  timeout -k 15 -s INT 45 $PY -m harness run --op attention_backward --backend cupy@fa2 --backend cupy@fa2_det \
    --backend cupy --cases smoke --device cuda --json "$R/smoke.json" > "$R/smoke.log" 2>&1
  echo "exit $?"; tail -3 "$R/smoke.log"; statuses "$R/smoke.log"
  grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$R/smoke.log" | head -20
fi

if has full; then
  ext_ready
  backends="--backend cupy@fa2 --backend cupy@fa2_det"
  [[ $EXT == 1 ]] && backends="$backends --backend torch_ext"
  stamp "== full: $FULL_JOBS shards of $backends --cases full"
  jobs=$R/full-jobs.txt
  : > "$jobs"
  for ((i = 0; i < FULL_JOBS; i++)); do
    echo "full$i: --op attention_backward $backends --cases full --device cuda --shard $i/$FULL_JOBS" >> "$jobs"
  done
  OUT=$R/full timeout -k 15 -s INT "$((FULL_S + 10))" bash scripts/gpu_parallel_run.sh "$jobs" "$FULL_S" > "$R/full.log" 2>&1
  echo "exit $?"
  mkdir -p "$R/full/x" && tar -xzf "$R/full/runs.tar.gz" -C "$R/full/x" 2>/dev/null
  for f in "$R"/full/x/runs/*.log; do tail -1 "$f"; done
  echo "statuses:"; statuses "$R"/full/x/runs/*.log
  grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$R"/full/x/runs/*.log | head -30
  rm -rf "$R/full/x"
fi

if has repeat; then
  stamp "== repeat: cupy@fa2_det, 50 calls per case bitwise equal"
  timeout -k 15 -s INT 40 $PY -m harness run --op attention_backward --backend cupy@fa2_det \
    --cases scripts/gpu/cases/cuda_attn_repeat.json --device cuda --repeat 50 --json "$R/repeat.json" > "$R/repeat.log" 2>&1
  echo "exit $?"; tail -2 "$R/repeat.log"; statuses "$R/repeat.log"
  grep -hE "^(FAIL|ERROR|CRASH)" "$R/repeat.log" | head -10
fi

if has bench; then
  ext_ready
  ext=""
  [[ $EXT == 1 ]] && ext="--backend torch_ext"
  stamp "== bench: perf cases, cupy (fa2), cupy@fa2_det, $ext, sdpa_flash, sdpa_cudnn, triton"
  timeout -k 15 -s INT "$((BENCH_S + 10))" $PY -m harness bench --op attention_backward --backend cupy --backend cupy@fa2_det $ext \
    --backend sdpa_flash --backend sdpa_cudnn --backend triton --cases perf --device cuda --budget "$BUDGET" ${BENCH_ARGS:-} \
    --time-limit "$((BENCH_S - 20))" --report "$R/bench" --no-plots > "$R/bench.log" 2> "$R/bench.err"
  echo "exit $?"; tail -3 "$R/bench.err"
  stamp "== summary -> $OUT/summary.txt"
  $PY scripts/gpu/tflops_table.py "$R/bench/results.json" --impl cupy@best --impl cupy@fa2_det --impl torch_ext \
    --impl sdpa_flash --impl sdpa_cudnn --impl triton --ratio cupy@best/sdpa_flash --ratio cupy@best/sdpa_cudnn \
    --ratio cupy@fa2_det/sdpa_flash | tee "$OUT/summary.txt"
fi
stamp "== pack"
tar -czf "$OUT/cuda_attn.tgz" -C "$OUT" res && rm -rf "$R"
stamp "== done"
