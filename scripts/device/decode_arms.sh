#!/usr/bin/env bash
# Several-arm decode-step timing on the device machine, all arms in one run (carry
# [".device/starling"] after scripts/device/build_gpu_tests.sh):
#   bash scripts/device/decode_arms.sh default STARLING_GEMV_PREFETCH_BYTES=2048 … -- [bench decode flags]
# Each arm is `default` (no assignment) or one VAR=VALUE; the arms run in order, twice over, so
# clock drift hits them alike. Writes $OUT/arms.md (every table, labelled) and $OUT/arms.tar.gz
# (each run's JSON and table), staying under the device tool's 8 returned files.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
arms=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  arms+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift
[ ${#arms[@]} -gt 0 ] || { echo "usage: decode_arms.sh ARM… -- [bench decode flags]" >&2; exit 2; }
runs=$(mktemp -d)
date -u +%FT%TZ | tee "$OUT/date.txt"
for round in 1 2; do
  for i in "${!arms[@]}"; do
    arm=${arms[$i]}
    tag="arm${i}_round${round}"
    echo "## $tag: $arm" | tee -a "$OUT/arms.md"
    if [ "$arm" = default ]; then
      .device/starling bench decode "$@" --output "$runs/$tag.json" > "$runs/$tag.md"
    else
      env "$arm" .device/starling bench decode "$@" --output "$runs/$tag.json" > "$runs/$tag.md"
    fi
    grep "^|" "$runs/$tag.md" | tee -a "$OUT/arms.md"
  done
done
tar -czf "$OUT/arms.tar.gz" -C "$runs" .
