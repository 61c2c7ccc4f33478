#!/usr/bin/env bash
# GPU checks with Qwen2.5-Coder-1.5B staged in $HOME/stage and the committed HF fixture
# (tests/fixtures/hf_qwen2_5_coder_1_5b.json, made by scripts/device/qwen_gpu_check.sh).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
export STARLING_TEST_GGUF=$HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
export STARLING_HF_FIXTURE=tests/fixtures/hf_qwen2_5_coder_1_5b.json
timeout 120 .device/tests/parity-* --include-ignored --test-threads=1 --nocapture 2>&1 | grep -E "rel err|test |panicked|result" | tee -a "$OUT/gpu_tests.log"
timeout 300 .device/tests/model_gpu-* --include-ignored --test-threads=1 --nocapture 2>&1 | grep -E "rel err|test |Δ|divergence|cpu \[|gpu \[|panicked|result|pos " | tee -a "$OUT/gpu_tests.log"
timeout 60 .device/starling generate --device cuda --model "$STARLING_TEST_GGUF" --chat --prompt "Write a Python function that checks whether a number is prime." --temperature 0 --max-tokens 80 2>&1 | tail -20 | tee "$OUT/generate_cuda.txt"
