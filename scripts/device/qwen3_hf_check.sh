#!/usr/bin/env bash
# Qwen3 against HF transformers on the GPU machine (issue 18): transformers builds a tiny random
# Qwen3 (head_dim 128, the width of the real models' heads and one the CUDA attention kernels take)
# and its f32 CPU reference logits; Starling loads the HF directory onto the GPU and compares
# (crates/starling-cuda/tests/model_gpu.rs, qwen3_tiny_gpu_logits_match_hf_transformers), then the
# per-head norm kernel's parity test runs.
#   here:  bash scripts/device/build_gpu_tests.sh          (test binaries into .device/)
#          pip download --only-binary=:all: --dest .device/wheels transformers safetensors
#          (and their dependencies the device lacks; torch is expected there)
#   there: bash scripts/device/qwen3_hf_check.sh          (carry [".device"])
# Writes $OUT/qwen3_hf_check.log (copy it to bench/results/ with the session's notes).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
log=$out/qwen3_hf_check.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
if compgen -G ".device/wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .device/wheels/*.whl
  export PYTHONPATH="$HOME/site${PYTHONPATH:+:$PYTHONPATH}"
fi
fixture=$out/qwen3_tiny_d128
# The reference on the CPU in f32, as the committed CPU fixture was made.
CUDA_VISIBLE_DEVICES="" python3 scripts/make_hf_fixture.py "$fixture" --head-dim 128 2>&1 \
  | grep -v -i warn | tee -a "$log"
[ -e "$fixture/reference.json" ] || { echo "no fixture was made" | tee -a "$log"; exit 1; }
status=0
for t in .device/tests/model_gpu-*; do
  STARLING_QWEN3_FIXTURE=$fixture "$t" --include-ignored --exact \
    qwen3_tiny_gpu_logits_match_hf_transformers --nocapture 2>&1 | tee -a "$log" || status=1
done
for t in .device/tests/parity-*; do
  "$t" --include-ignored rms_norm_heads --nocapture 2>&1 | tee -a "$log" || status=1
done
exit $status
