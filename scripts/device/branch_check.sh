#!/usr/bin/env bash
# Runs one build's GPU tests on the device (carry [".device/$D"], built by build_gpu_tests.sh and
# copied to .device/$D): every test binary's ignored tests, one log in $OUT, a pass/fail summary.
#   D=int bash scripts/device/branch_check.sh [TEST_FILTER]
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARLING_HOME=${STARLING_HOME:-$HOME/.cache/starling}
dir=.device/${D:?set D to the folder under .device}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date -u +%FT%TZ
status=0
for t in "$dir"/tests/*; do
  echo "== $t" >> "$OUT/tests.log"
  "$t" --include-ignored --test-threads=1 ${1:+"$1"} >> "$OUT/tests.log" 2>&1 || status=1
done
grep -E "^test .*(FAILED|ok)$|^test result|panicked" "$OUT/tests.log" | grep -v " ok$" | tail -40
echo "tests status $status"
exit $status
