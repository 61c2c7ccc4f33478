#!/usr/bin/env bash
# On the GPU machine (run from the repo root through the device tool), after the GGUF was staged to
# $HOME/stage with ../shared/tools/stage-chunks and the gguf wheel carried in .device/wheels:
#   bash scripts/device/hf_fixture.sh SmolLM2-135M-Instruct.Q4_1.gguf smollm2_135m
set -euo pipefail
gguf=${1:?gguf file name in \$HOME/stage}; tag=${2:?fixture tag}
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .device/wheels/*.whl
export PYTHONPATH="$HOME/site" PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
python3 scripts/hf_reference_fixture.py "$HOME/stage" "$gguf" "$OUT/hf_${tag}.json" 16
