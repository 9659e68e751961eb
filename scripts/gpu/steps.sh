# Steps shared by the batch scripts (scripts/gpu/batch_s5.sh ... batch_s9b.sh, bb_both.sh): source it with OUT, PY
# (python) and STEPS (the steps to run) set; it makes R=$OUT/res, sends the output to $OUT/run.log as
# well, and starts the clock.  The script defines pack (re-packs $R), which the steps call.
: "${OUT:?set OUT to a folder for the results}"
# What a torch_ext build and the harness want on the device (a script may set its own first).
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
R=$OUT/res
# pack: $R re-packed into $OUT/$PACK.tgz (PACK set by the script; a script may define its own pack)
pack() { tar czf "$OUT/${PACK:-res}.tgz" -C "$OUT" res; }
mkdir -p "$R"
exec > >(tee "$OUT/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
failures() { grep -hE "^(FAIL|ERROR|CRASH|TIMEOUT)" "$@" | head -20; }

# threads N: the BLAS/OpenMP env of one of N processes run side by side (the float64 oracle passes are numpy
# matmuls; 4 processes on 2 cores, each starting a thread per core, took 6.3 s a case against 1.2 s: 10.0 s
# against 4.9 s for the four)
threads() { local t=$(( $(nproc) / $1 )); [ "$t" -ge 1 ] || t=1; echo "OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t"; }

# full_shards SECONDS ARGS...: `harness run --cases full --device cuda ARGS` in 8 shards side by side,
# each under SECONDS (SIGINT: the JSON checkpoint is still written) -> $R/full-K.{json,log}
full_shards() {
  local limit=$1 pids=() k p f
  shift
  for k in 0 1 2 3 4 5 6 7; do
    env $(threads 8) timeout -s INT "$limit" $PY -m harness run --cases full --device cuda "$@" --shard "$k/8" \
      --json "$R/full-$k.json" > "$R/full-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log; pack
}

# attn_repeat IMPL SECONDS: IMPL --repeat 50 on scripts/gpu/cases/cuda_attn_repeat.json (a deterministic
# implementation must give the same bits every call) -> $R/repeat.{json,log}
attn_repeat() {
  stamp "== repeat: 50 calls per case, $1"
  timeout -k 15 -s INT "$2" $PY -m harness run --op attention_backward --backend "$1" \
    --cases scripts/gpu/cases/cuda_attn_repeat.json --device cuda --repeat 50 --json "$R/repeat.json" \
    > "$R/repeat.log" 2>&1
  echo "exit $?"; tail -2 "$R/repeat.log"; failures "$R/repeat.log"; pack
}

# setup [BUILD_SECONDS]: pip install, the GPU's name and clocks; with BUILD_SECONDS, the torch_ext build
# starts in the background (MAX_JOBS from the caller) and `build` holds its pid: `wait "$build"` before
# torch_ext runs -> $R/build.log
setup() {
  stamp "== setup"
  timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
  if [ -n "${1:-}" ]; then
    ( timeout "$1" $PY -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')" \
        > "$R/build.log" 2>&1 ) &
    build=$!
  fi
}

# shards_to DIR: move full_shards' files into $R/DIR (before the next full_shards call)
shards_to() { mkdir -p "$R/$1" && mv "$R"/full-*.json "$R"/full-*.log "$R/$1/"; }

# profile LIST PATTERN: harness profile (ncu) of each line "op impl case-json" of LIST whose impl matches
# PATTERN (grep -E), each under 150 s -> $R/profile/OP-IMPL-HASH.{txt,json}, re-packed after each
profile() {
  mkdir -p "$R/profile"
  grep -vE '^(#|$)' "$1" | awk -v pat="$2" '$2 ~ pat' | while read -r op impl case; do
    name=$(echo "$op-${impl//@/-}-$case" | md5sum | cut -c1-8)
    stamp "profile $op $impl $case"
    timeout -s INT 150 $PY -m harness profile --op "$op" --backend "$impl" --case "$case" \
      --json "$R/profile/$op-${impl//@/-}-$name.json" > "$R/profile/$op-${impl//@/-}-$name.txt" 2>&1
    tail -12 "$R/profile/$op-${impl//@/-}-$name.txt"
    pack  # each profile comes back even if the call is cut off by its time limit
  done
}
