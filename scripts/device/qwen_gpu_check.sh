#!/usr/bin/env bash
# On the device, after staging Qwen2.5-Coder-1.5B to $HOME/stage (../shared/tools/stage-chunks) and
# carrying .device (test binaries, starling, wheels): HF transformers fixture (f32, CPU), then the
# GPU checks against it and against the CPU backend, then a generation through the engine on CUDA.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
gguf=$HOME/stage/$name
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .device/wheels/*.whl
PYTHONPATH="$HOME/site" CUDA_VISIBLE_DEVICES="" python3 scripts/hf_reference_fixture.py \
  "$HOME/stage" "$name" "$OUT/hf_qwen2_5_coder_1_5b.json" 16 2>&1 | grep -v Warning | tail -6
export STARLING_TEST_GGUF=$gguf STARLING_HF_FIXTURE=$OUT/hf_qwen2_5_coder_1_5b.json
for t in .device/tests/model_gpu-* .device/tests/parity-*; do
  "$t" --include-ignored --test-threads=1 --nocapture 2>&1 | grep -E "rel err|test |Δ|divergence|cpu \[|gpu \[|panicked|result" | tee -a "$OUT/gpu_tests.log"
done
.device/starling generate --device cuda --model "$gguf" --chat --prompt "Write a Python function that checks whether a number is prime." --temperature 0 --max-tokens 80 2>&1 | tail -20
