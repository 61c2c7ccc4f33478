#!/usr/bin/env bash
# STAR-KV latents on the H200 (issue 15), one device call: every GPU test that needs no staged
# model (kernel parity incl. the latent kernels, graphs with latent layers, the engine harness
# on {CPU, CUDA} x {full, eviction, latent, latent + eviction}, per-request failures), then the
# kernel bench (dense, latent, FA2 in the same run).
#   here:  bash scripts/device/build_gpu_tests.sh
#   there: bash scripts/device/latent_gpu.sh [quick]      (carry [".device"])
# Results in $OUT: gpu_tests.log, kernels.json, fa2.json, kernels.md, date.txt.
#   PARTS="tests bench" (default both); TESTS="parity graphs_gpu" (test binaries by name prefix,
#   default all); SCORES="reconstruct rotary" runs the bench once per STARLING_LATENT_SCORES
#   value (kernels_<value>.{json,md}); LATENT_ONLY=1 passes --latent-only.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PARTS=${PARTS:-tests bench}
quick=${1:-}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$OUT/date.txt"
status=0
if [[ " $PARTS " == *" tests "* ]]; then
  log=$OUT/gpu_tests.log
  for t in .device/tests/*; do
    name=$(basename "$t")
    if [ -n "${TESTS:-}" ]; then
      keep=0; for p in $TESTS; do [[ $name == $p-* ]] && keep=1; done
      [ $keep -eq 1 ] || continue
    fi
    # Tests that need a staged real model run in scripts/device/qwen_gpu_tests.sh.
    skip=()
    case $name in model_gpu-*) skip=(--skip real_model);; esac
    echo "== $name" | tee -a "$log"
    timeout 300 "$t" --include-ignored --test-threads=1 "${skip[@]}" > "$OUT/one.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    grep -v '^test .* \.\.\. ok$' "$OUT/one.log" >> "$log"
    grep -E '^(test result|---- )|panicked' "$OUT/one.log" | head -20
    echo "rc $rc" | tee -a "$log"
  done
  rm -f "$OUT/one.log"
  echo "gpu tests status $status" | tee -a "$log"
fi
if [[ " $PARTS " == *" bench "* ]]; then
  timeout 200 python3 scripts/bench/fa2_baseline.py "$OUT/fa2.json" ${quick:+--quick} || status=1
  for v in ${SCORES:-reconstruct}; do
    tag=$([ -n "${SCORES:-}" ] && echo "_$v")
    STARLING_LATENT_SCORES=$v timeout 400 .device/starling bench kernels ${quick:+--quick} \
      ${LATENT_ONLY:+--latent-only} --output "$OUT/kernels$tag.json" > "$OUT/kernels_stdout$tag.md" 2>&1 || status=1
    grep -i "latent" "$OUT/kernels_stdout$tag.md" | head -40
    python3 scripts/bench/merge_kernels.py "$OUT/kernels$tag.json" "$OUT/fa2.json" "$OUT/kernels$tag.md" > /dev/null || status=1
  done
fi
exit $status
