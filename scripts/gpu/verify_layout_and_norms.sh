#!/usr/bin/env bash
# One device call after the layout merge: build (torch_ext with CUDA), the smoke set of every op
# through the kernel backends and the torch baseline, then the triton norms tuning batch.
# Everything lands in $OUT/verify.tgz plus a summary on stdout.
set -u
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0
: "${OUT:?set OUT}"; W=/tmp/verify; mkdir -p $W
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
pip install -q -e . --no-deps --no-build-isolation > $W/pip.log 2>&1
stamp "== list (builds torch_ext)"; python3 -m harness list > $W/list.txt 2>&1; grep -E "unavailable|failed" $W/list.txt | head
stamp "== smoke: cupy, torch_ext, triton, torch"
timeout ${SMOKE_LIMIT:-240} python3 -m harness run --cases smoke --backend cupy --backend torch_ext --backend triton \
  --backend torch --json $W/smoke.json > $W/smoke.log 2>&1; echo "exit $?"
grep -E "^(FAIL|ERROR|CRASH)" $W/smoke.log | head -20; tail -1 $W/smoke.log
stamp "== triton norms tuning batch"
OUT=$W/norms TOTAL=${NORMS_TOTAL:-280} CHECK_LIMIT=${NORMS_CHECK:-130} bash scripts/gpu/norms_tune.sh > $W/norms.log 2>&1
tail -45 $W/norms.log
tar czf $OUT/verify.tgz -C $W .
stamp done
