#!/usr/bin/env bash
# Qwen3, Mistral and Gemma-3 against HF transformers on the GPU machine (issue 18): transformers
# (there: 5.17 with torch 2.11) builds a tiny random model of each architecture from a config
# (real architecture code, random weights; scripts/make_hf_fixture.py) with heads the CUDA
# attention kernels take, saves it as an HF directory with its f32 CPU reference logits, and
# Starling loads that directory onto the GPU and compares (crates/starling-cuda/tests/model_gpu.rs,
# hf_tiny_gpu_logits_match_hf_transformers); then the per-head norm kernel's parity test runs.
#   here:  bash scripts/device/build_gpu_tests.sh          (test binaries into .device/)
#   there: bash scripts/device/hf_tiny_check.sh             (carry [".device/tests"])
#   ARCHS (default "qwen3 mistral gemma3"), HEAD_DIM (default 128; gemma3 takes 256).
# Writes $OUT/hf_tiny_check.log (copy it to bench/results/ with the session's notes).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
log=$out/hf_tiny_check.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$log"
status=0
for arch in ${ARCHS:-qwen3 mistral gemma3}; do
  head_dim=${HEAD_DIM:-128}
  [ "$arch" = gemma3 ] && head_dim=${GEMMA_HEAD_DIM:-256}
  fixture=$out/${arch}_tiny_d$head_dim
  echo "== $arch, heads of $head_dim" | tee -a "$log"
  # The reference on the CPU in f32, as the committed CPU fixtures were made.
  CUDA_VISIBLE_DEVICES="" python3 scripts/make_hf_fixture.py "$fixture" --arch "$arch" \
    --head-dim "$head_dim" 2>&1 | grep -v -i warn | tee -a "$log"
  if [ ! -e "$fixture/reference.json" ]; then
    echo "$arch: no fixture was made" | tee -a "$log"; status=1; continue
  fi
  for t in .device/tests/model_gpu-*; do
    STARLING_HF_TINY_FIXTURE=$fixture "$t" --include-ignored --exact \
      hf_tiny_gpu_logits_match_hf_transformers --nocapture 2>&1 | tee -a "$log" || status=1
  done
  rm -rf "$fixture"/*.safetensors
done
for t in .device/tests/parity-*; do
  "$t" --include-ignored rms_norm_heads --nocapture 2>&1 | tee -a "$log" || status=1
done
exit $status
