#!/usr/bin/env bash
# GPU test run on the device machine (through the device tool), from the repo root:
#   here:  bash scripts/device/build_gpu_tests.sh      (builds and copies test binaries to .device/)
#   there: bash scripts/device/gpu_tests.sh            (carry [".device"])
# Runs every test binary's ignored (GPU) tests and fails if any fails.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARLING_HOME=${STARLING_HOME:-$HOME/.cache/starling}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
for t in .device/tests/*; do
  echo "== $t"
  "$t" --include-ignored --test-threads=1 --nocapture 2>&1 | tee -a "${OUT:-/tmp}/gpu_tests.log" || status=1
done
exit $status
