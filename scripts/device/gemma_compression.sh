#!/usr/bin/env bash
# Eviction and STAR-KV on Gemma-3-270M on the H200 (issue 18): the quality bench (held-out
# essays, KL and perplexity against uncompressed) for the eviction methods and for a STAR-KV
# checkpoint through the reference path, then NIAH for the eviction methods (the base model does
# not answer the needle question, so the cells are compared with the uncompressed tokens).
# Staged: the GGUF at $HOME/stage/g.gguf (sha256 below), $D (default $HOME/niahd) holding the
# stripped starling binary and essays/, the checkpoint directory at $CKPT (default
# $HOME/gemma_ckpt; `starling calibrate -m gemma3-270m --profiles balanced --output DIR`).
# Results under $OUT/quality_evict, $OUT/quality_starkv, $OUT/niah_evict.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
D=${D:-$HOME/niahd}
CKPT=${CKPT:-$HOME/gemma_ckpt}
gguf=$HOME/stage/g.gguf
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $gguf" | sha256sum -c -
# An evicting engine-wide policy makes the engine keep every layer's slots in one table (no
# release behind the window), so each request may then bring its own method (`none` too).
engine_policy='{"method":"keydiff","ratio":0.5}'
methods=none,keydiff@0.5,snapkv@0.5,knorm@0.5,streaming_llm@0.5,tova@0.5,keydiff@0.75,snapkv@0.75
"$D/starling" bench quality --device cuda --model "$gguf" --essays-dir "$D/essays" \
  --methods "$methods" --context-tokens 4096 --eval-tokens 256 --num-windows 6 \
  --kv-compression "$engine_policy" --output "$OUT/quality_evict" 2>&1 | grep -v WARN | tail -14
"$D/starling" bench quality --device cuda --model "$gguf" --essays-dir "$D/essays" \
  --methods none --context-tokens 4096 --eval-tokens 256 --num-windows 6 \
  --kv-compression "{\"method\":\"star_kv\",\"checkpoint\":\"$CKPT\",\"rank_profile\":\"balanced\",\"cache\":\"reference\"}" \
  --output "$OUT/quality_starkv" 2>&1 | grep -v WARN | tail -6
"$D/starling" bench niah --device cuda --model "$gguf" --essays-dir "$D/essays" \
  --contexts 8k,16k,30k --depths 0,25,50,75,100 --max-new-tokens 32 --protocol whole-prompt \
  --methods none,keydiff@0.5,snapkv@0.5,streaming_llm@0.5,keydiff@0.75 \
  --kv-compression "$engine_policy" --output "$OUT/niah_evict" 2>&1 | grep -v WARN | tail -30
