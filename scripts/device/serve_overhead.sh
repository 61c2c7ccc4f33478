#!/usr/bin/env bash
# HTTP + channel overhead at batch 64 (issue 4): the same decode work with and without the server.
# Engine only: `bench throughput` drives Engine::step directly (sampling and detokenisation
# included). Served: 64 concurrent streams of the same lengths through `serve` + `bench serve`.
# Short prompts and long outputs, so nearly every step is a pure batch-64 decode step.
# Needs the SmolLM2 GGUF at $HOME/stage/smollm2.gguf (tokenizer).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
TOK=${TOK:-$HOME/stage/smollm2.gguf}
# Extra engine flags for both runs, e.g. ENGINE_FLAGS="--cuda-graphs on".
ENGINE_FLAGS=${ENGINE_FLAGS:-}
date -u +%FT%TZ > "$OUT/date.txt"
$S bench throughput --device cuda --load-format synthetic --model llama2-7b --tokenizer "$TOK" \
  --batch-sizes 64 --prompt-tokens 64 --output-tokens 512 --max-model-len 4096 $ENGINE_FLAGS \
  --output "$OUT/engine_b64.json" | tee "$OUT/engine_b64.md"
$S serve --device cuda --load-format synthetic --model llama2-7b --tokenizer "$TOK" \
  --max-model-len 4096 --port 8012 $ENGINE_FLAGS > "$OUT/serve.log" 2>&1 &
pid=$!
wait_healthy 8012 "$pid" || echo "server did not start"
$S bench serve --base-url http://127.0.0.1:8012 --model llama2-7b --dataset random --random-input-len 64 \
  --random-output-len 512 --ignore-eos --seed 2 --num-prompts 64 --max-concurrency 64 \
  --output-json "$OUT/served_b64.json" --output-md "$OUT/served_b64.md" | tail -22
# The server's own step time (starling:engine_step_seconds) beside the TPOT its clients saw.
python3 - <<'PY'
import urllib.request as u
text = u.urlopen('http://127.0.0.1:8012/metrics').read().decode()
vals = {l.split('{')[0].split(' ')[0]: float(l.rsplit(' ', 1)[1]) for l in text.splitlines()
        if l.startswith('starling:engine_step_seconds_sum') or l.startswith('starling:engine_step_seconds_count')}
s, n = vals['starling:engine_step_seconds_sum'], vals['starling:engine_step_seconds_count']
print(f"server engine step: mean {1000 * s / n:.2f} ms over {int(n)} steps")
PY
kill -TERM $pid; wait $pid
