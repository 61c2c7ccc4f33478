#!/usr/bin/env bash
# A/B decode-step timing on the device machine, both arms in one run (carry [".device"] after
# scripts/device/build_gpu_tests.sh):
#   bash scripts/device/decode_ab.sh STARLING_PDL=0 [extra `bench decode` flags]
# Runs `starling bench decode` once with the environment assignment (arm A: the baseline) and once
# without it (arm B: the default build), alternating twice so clock drift hits both arms alike.
# Writes $OUT/decode_{A,B}{1,2}.json and .md.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
assignment=${1:?usage: decode_ab.sh VAR=VALUE [bench decode flags]}
shift
date -u +%FT%TZ | tee "$OUT/date.txt"
echo "arm A: $assignment; arm B: default" | tee "$OUT/arms.txt"
for round in 1 2; do
  env "$assignment" .device/starling bench decode "$@" --output "$OUT/decode_A$round.json" \
    | tee "$OUT/decode_A$round.md"
  .device/starling bench decode "$@" --output "$OUT/decode_B$round.json" | tee "$OUT/decode_B$round.md"
done
