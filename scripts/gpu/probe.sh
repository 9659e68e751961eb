#!/usr/bin/env bash
# First device call: environment, the profile command on two implementations (its raw ncu CSV kept
# as a test fixture), and the binary_backward smoke set through the kernel backends after the
# package split.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pip install -q -e . --no-deps --no-build-isolation > $OUT/pip.log 2>&1 || tail -5 $OUT/pip.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton, cupy, jax; print(torch.__version__, triton.__version__, cupy.__version__, jax.__version__)" | tee -a $OUT/env.txt
CASE='{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[8,2048,4096],"b":[4096]}}'
for impl in cupy@opt triton; do
  timeout 120 python3 -m harness profile --op binary_backward --backend $impl --case "$CASE" --json $OUT/profile-$impl.json 2>&1 | tee $OUT/profile-$impl.txt
done
ncu --profile-from-start off --clock-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__waves_per_multiprocessor \
  python3 -m harness.profile --child --op binary_backward --backend cupy@opt --case "$CASE" > $OUT/ncu-raw-sample.csv 2>&1
timeout 200 python3 -m harness run --op binary_backward --backend cupy --backend triton --cases smoke --json $OUT/bb-smoke.json 2>&1 | tail -4
