#!/usr/bin/env bash
# Batch D (one device call, ~9.5 min): scripts/jobs/kernels-full-3a.txt side by side while torch_ext
# builds, then kernels-full-3b.txt (torch_ext norms).  $OUT/a and $OUT/b get summary.txt and runs.tar.gz;
# $OUT/build.tgz holds build/torch_ext so later calls can carry it.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=16 XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
base=$OUT
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
t0=$(date +%s)
OUT=$base/a bash scripts/gpu_parallel_run.sh scripts/jobs/kernels-full-3a.txt "${PAR_A:-520}" > /dev/null 2>&1 &
python3 -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')" 2>&1 | tail -3
echo "build took $(( $(date +%s) - t0 )) s"
left=$(( ${PAR_A:-520} - ($(date +%s) - t0) ))
OUT=$base/b bash scripts/gpu_parallel_run.sh scripts/jobs/kernels-full-3b.txt "$left" > /dev/null 2>&1
wait
cat "$base/a/summary.txt" "$base/b/summary.txt"
tar -czf "$base/build.tgz" build/torch_ext 2>/dev/null; du -sh build/torch_ext "$base/build.tgz"
