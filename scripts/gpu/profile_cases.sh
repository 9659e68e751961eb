#!/usr/bin/env bash
# `harness profile` over a list of (op, impl, case) lines in a file: one ncu report each, under $OUT/profile/.
#   OUT=dir bash scripts/gpu/profile_cases.sh LIST      LIST lines: "<op> <impl> <json case>"
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"; mkdir -p "$OUT/profile"
i=0
while read -r op impl case; do
  [ -z "$op" ] || [ "${op:0:1}" = "#" ] && continue
  i=$((i + 1)); name=$(printf "%02d-%s-%s" $i "$op" "${impl//@/-}")
  echo "== $op $impl $case"
  timeout 150 python3 -m harness profile --op "$op" --backend "$impl" --case "$case" --json "$OUT/profile/$name.json" \
    2>&1 | tee "$OUT/profile/$name.txt" | tail -30
done < "$1"
