#!/usr/bin/env bash
# NIAH and quality on the GPU machine (run from the repo root through the device tool), after
# staging the Qwen2.5-Coder-1.5B GGUF to $HOME/stage (../shared/tools/stage-chunks) and carrying
# .device with: starling (release binary), wheels/ (the gguf wheel for transformers), essays/ (a
# copy of $STARLING_HOME/datasets/paul-graham-essays: the machine has no network to fetch them).
#
#   bash scripts/device/niah_gpu.sh [CONTEXTS] [METHODS] [QUALITY_METHODS]
#
# 1. Starling writes every cell's prompt ids (prompts.json) without running the engine;
# 2. HF transformers (bf16, same GGUF) answers those prompts greedily (hf_answers.json);
# 3. Starling runs every method, with the cell-by-cell agreement of `none` with HF;
# 4. the quality run (KL / perplexity on held-out essays), unless QUALITY_METHODS is "skip".
# Everything lands in $HOME/niah, returned as $OUT/niah.tgz (the device returns at most 8 files),
# with the two markdown summaries beside it.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
contexts=${1:-1k,4k,8k,16k,30k}
methods=${2:-none,keydiff@0.25,keydiff@0.5,keydiff@0.75,snapkv@0.5,streaming_llm@0.5,knorm@0.5,random@0.5}
quality_methods=${3:-none,keydiff@0.25,keydiff@0.5,keydiff@0.75,snapkv@0.5,streaming_llm@0.5}
name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
gguf=$HOME/stage/$name
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c -
work=$HOME/niah
mkdir -p "$work"
common=(--device cuda --model "$gguf" --contexts "$contexts" --essays-dir .device/essays
  --max-new-tokens 64 --output "$work")

date -u +%FT%TZ | tee "$work/date.txt"
.device/starling bench niah "${common[@]}" --methods none --dump-prompts --prompts-only
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .device/wheels/*.whl
PYTHONPATH="$HOME/site" python3 scripts/niah_hf.py "$HOME/stage" "$name" \
  "$work/prompts.json" "$work/hf_answers.json" 2>&1 | grep -v -i warning | tee "$work/hf.log"
.device/starling bench niah "${common[@]}" --methods "$methods" \
  --compare-hf "$work/hf_answers.json" 2>&1 | tee "$work/niah.log"
cp "$work/niah_summary.md" "$OUT/"
if [ "$quality_methods" != skip ]; then
  mkdir -p "$work/quality"
  .device/starling bench quality --device cuda --model "$gguf" --essays-dir .device/essays \
    --methods "$quality_methods" --context-tokens 4096 --eval-tokens 256 --num-windows 6 \
    --output "$work/quality" 2>&1 | tee "$work/quality.log"
  cp "$work/quality/quality.md" "$OUT/"
fi
tar czf "$OUT/niah.tgz" -C "$HOME" niah
