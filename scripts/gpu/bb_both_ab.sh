set -u
python3 scripts/gpu/both_broadcast_cases.py perf $OUT/both_perf.json
CASE='{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}'
for s in default yg=2 yg=4 bothminblocks=3 bothminblocks=2,yg=2 bothminblocks=2,yg=4; do
  v=$s; [ "$s" = default ] && v=
  GRADORACLE_CUPY_BB=$v timeout -s INT 45 python3 -m harness bench --op binary_backward --cases $OUT/both_perf.json --backend cupy@best --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 200 --no-plots -q --time-limit 40 --report $OUT/ab-$s > $OUT/ab-$s.log 2>&1
  echo "== $s"; grep -E 'A=1x2048' $OUT/ab-$s.log
done
GRADORACLE_TRITON_BINARY=lean timeout -s INT 40 python3 -m harness profile --op binary_backward --backend triton --case "$CASE" --json $OUT/prof-triton-lean.json > $OUT/prof-triton-lean.txt 2>&1; tail -8 $OUT/prof-triton-lean.txt
GRADORACLE_CUPY_BB=yg=2 timeout -s INT 40 python3 -m harness profile --op binary_backward --backend cupy@best --case "$CASE" --json $OUT/prof-cupy-yg2.json > $OUT/prof-cupy-yg2.txt 2>&1; tail -8 $OUT/prof-cupy-yg2.txt
