#!/usr/bin/env bash
# Serving benchmark on the GPU (issue 4): synthetic llama2-7b shape behind `starling serve`,
# driven by `starling bench serve` (random prompts as token ids, fixed output lengths), plus the
# engine-only decode step at batch 64 in the same session for the HTTP-overhead comparison.
# Needs the SmolLM2 GGUF staged at $HOME/stage/smollm2.gguf (its tokenizer serves the API).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
ENGINE_FLAGS=${ENGINE_FLAGS:-}
date -u +%FT%TZ > "$OUT/date.txt"
$S serve --device cuda --load-format synthetic --model llama2-7b --tokenizer "$HOME/stage/smollm2.gguf" \
  --max-model-len 4096 --port 8011 $ENGINE_FLAGS > "$OUT/serve.log" 2>&1 &
pid=$!
wait_healthy 8011 "$pid" || { echo "server did not start"; tail -20 "$OUT/serve.log"; exit 1; }
common=(--base-url http://127.0.0.1:8011 --model llama2-7b --dataset random --random-input-len 1024
        --random-output-len 256 --random-range-ratio 0.25 --ignore-eos --seed 1)
timeout 240 $S bench serve "${common[@]}" --num-prompts 60 --max-concurrency 20 \
  --output-json "$OUT/serve_c20.json" --output-md "$OUT/serve_c20.md" | tail -30
timeout 300 $S bench serve "${common[@]}" --num-prompts 128 --sweep-concurrency 1,8,32,64,128 --sweep-prompts-per-concurrency 2 \
  --output-json "$OUT/serve_sweep.json" --output-md "$OUT/serve_sweep.md" --output-png "$OUT/serve_sweep.png" | tail -20
kill -TERM $pid; wait $pid; echo "server exit code $?"
timeout 120 $S bench decode --models llama2-7b --batch-sizes 64 --contexts 1152 --output "$OUT/decode_b64.json" | tail -3
