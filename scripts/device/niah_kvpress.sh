#!/usr/bin/env bash
# NIAH, Starling beside NVIDIA kvpress on the same prompts and grid (issue 17), on the H200.
# Qwen2.5-Coder-1.5B staged at $HOME/stage (../shared/tools/stage-chunks); .device/ built by
# scripts/device/build_evict_scale.sh: starling, wheels/ (gguf, kvpress), essays/.
#
#   bash scripts/device/niah_kvpress.sh            # everything, about 8 minutes
#   PART=kvpress bash ...; PART=starling bash ...   # the same in two calls (keep the machine warm)
#
# 1. Starling writes every cell's prompt ids and its question split (prompts.json);
# 2. kvpress answers them (scripts/niah_kvpress.py: compressed context prefill, uncompressed
#    question, greedy), all depths of a context length in one batch;
# 3. Starling runs the same methods on the same prompts (--protocol), then draws per method the
#    two heatmaps side by side (compare_*.png), accuracy against ratio for every method and both
#    systems (accuracy_vs_ratio.png) and the KV bytes each held (niah_summary.md).
# Returned: $OUT/niah_summary.md, $OUT/accuracy_vs_ratio.png and $OUT/niah_kvpress.tgz (all
# results, logs and heatmaps; commit them under bench/results/).
#   CONTEXTS (1k,4k,8k,16k), DEPTHS (11), RATIOS (0.5,0.75,0.9), METHODS (names), PROTOCOL
#   (context-question or whole-prompt); another model: GGUF_NAME and GGUF_SHA256 (staged at
#   $HOME/stage), D (the folder holding starling, wheels/ and essays/; default .device).
#   Gemma-3-270M, transformers against Starling with no press (issue 18):
#   GGUF_NAME=g.gguf GGUF_SHA256=a5fd3b62... D=.device/niah RATIOS= METHODS= PROTOCOL=whole-prompt
#   CONTEXTS=8k,16k,32k KVPRESS_ARGS="--dtype float32" bash scripts/device/niah_kvpress.sh
#   (KVPRESS_ARGS: extra flags for scripts/niah_kvpress.py; STARLING_ARGS: for Starling's run,
#   e.g. "--kv-cache-memory 768MiB" to show what a small cache holds at once.)
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PART=${PART:-all}
CONTEXTS=${CONTEXTS:-1k,4k,8k,16k}
DEPTHS=${DEPTHS:-0,10,20,30,40,50,60,70,80,90,100}
RATIOS=${RATIOS-0.5 0.75 0.9}
METHODS=${METHODS-snapkv tova keydiff knorm streaming_llm}
PROTOCOL=${PROTOCOL:-context-question}
D=${D:-.device}
list=none
for r in $RATIOS; do for m in $METHODS; do list="$list,$m@$r"; done; done
name=${GGUF_NAME:-qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
gguf=$HOME/stage/$name
sha=${GGUF_SHA256:-cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046}
echo "$sha  $gguf" | sha256sum -c -
work=$HOME/niah_kvpress
mkdir -p "$work"
common=(--device cuda --model "$gguf" --contexts "$CONTEXTS" --depths "$DEPTHS" --essays-dir "$D/essays"
  --max-new-tokens 32 --protocol "$PROTOCOL" --output "$work")
date -u +%FT%TZ | tee -a "$work/date.txt"
if [ "$PART" != starling ]; then
  "$D/starling" bench niah "${common[@]}" --methods none --dump-prompts --prompts-only
  python3 -m pip install -q --no-index --no-deps --target "$HOME/site" "$D"/wheels/*.whl
  PYTHONPATH="$HOME/site" python3 scripts/niah_kvpress.py "$HOME/stage" "$name" \
    "$work/prompts.json" "$work/kvpress_answers.json" --methods "$list" ${KVPRESS_ARGS:-} 2>&1 \
    | grep -v -i warning | tee -a "$work/kvpress.log"
fi
if [ "$PART" != kvpress ]; then
  "$D/starling" bench niah "${common[@]}" --methods "$list" ${STARLING_ARGS:-} \
    --compare-kvpress "$work/kvpress_answers.json" 2>&1 | tee "$work/niah.log" | tail -40
  cp "$work/niah_summary.md" "$work/accuracy_vs_ratio.png" "$OUT/" 2>/dev/null || true
  # Which cells generate the same greedy tokens in both systems.
  python3 scripts/bench/compare_niah_ids.py "$work/niah_results.json" \
    "$work/kvpress_answers.json" > "$OUT/cell_by_cell.txt" || true
  tail -1 "$OUT/cell_by_cell.txt"
fi
tar czf "$OUT/niah_kvpress.tgz" -C "$HOME" niah_kvpress
