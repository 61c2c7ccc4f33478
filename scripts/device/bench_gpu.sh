#!/usr/bin/env bash
# GPU benchmarks on the device machine (carry [".device"] after scripts/device/build_gpu_tests.sh):
# kernel timings + the FA2 baseline in the same run, merged into one table; decode step times of
# synthetic 7B models against the roofline. Everything lands in $OUT.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
quick=${1:-}
date -u +%FT%TZ | tee "$OUT/date.txt"
.device/starling bench kernels ${quick:+--quick} --output "$OUT/kernels.json"
python3 scripts/bench/fa2_baseline.py "$OUT/fa2.json" ${quick:+--quick}
python3 scripts/bench/merge_kernels.py "$OUT/kernels.json" "$OUT/fa2.json" "$OUT/kernels.md"
.device/starling bench decode --output "$OUT/decode.json" | tee "$OUT/decode.md"
