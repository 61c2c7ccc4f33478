#!/usr/bin/env bash
# Issue 5 target: at equal KV memory, eviction at ratio r admits >= 0.9/(1-r) times as many
# concurrent long requests. Synthetic llama2-7b (speed and capacity do not depend on weight
# values) behind `starling serve` with a fixed KV budget, long random prompts, many more clients
# than fit; bench serve reports the mean decode batch (concurrent requests decoding), peak KV
# use and preemptions per policy. Needs the SmolLM2 GGUF at $HOME/stage/smollm2.gguf (tokenizer),
# or TOK=another GGUF. ADMISSION=optimistic|reserve-peak (default optimistic) picks the admission
# policy; POLICIES (default "none keydiff@0.5 keydiff@0.75") the compression policies.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
TOK=${TOK:-$HOME/stage/smollm2.gguf}
KV=${KV:-8GiB}
ADMISSION=${ADMISSION:-optimistic}
POLICIES=${POLICIES:-none keydiff@0.5 keydiff@0.75}
date -u +%FT%TZ > "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/date.txt"
port=8013
echo "admission $ADMISSION" >> "$OUT/date.txt"
for policy in $POLICIES; do
  method=${policy%@*}; ratio=${policy#*@}; [ "$method" = none ] && ratio=0
  cfg="{\"method\":\"$method\",\"ratio\":$ratio}"
  port=$((port + 1))
  $S serve --device cuda --load-format synthetic --model llama2-7b --tokenizer "$TOK" \
    --max-model-len 4096 --max-num-batched-tokens 1024 --kv-cache-memory "$KV" --kv-compression "$cfg" --admission-policy "$ADMISSION" --port $port \
    > "$OUT/serve_$method${ratio}_$ADMISSION.log" 2>&1 &
  pid=$!
  wait_healthy "$port" "$pid" || echo "server on $port did not start"
  echo "== $policy ($cfg), KV budget $KV, admission $ADMISSION"
  timeout 150 $S bench serve --base-url http://127.0.0.1:$port --model llama2-7b --dataset random \
    --random-input-len 3072 --random-output-len 256 --ignore-eos --seed 5 --num-prompts 48 \
    --max-concurrency 48 --output-json "$OUT/capacity_$method${ratio}_$ADMISSION.json" | tail -14
  python3 -c "import urllib.request as u; print('\n'.join(l for l in u.urlopen('http://127.0.0.1:$port/metrics').read().decode().splitlines() if l.startswith('starling:kv_') and not l.startswith('#')))"
  kill -TERM $pid; wait $pid
done
