#!/usr/bin/env bash
# End to end (issue 15): synthetic llama2-7b behind `starling serve`, plain against STAR-KV
# latents at the prior work's 50% shape (key rank 64 per head, value rank 2048, every layer),
# at the same KV memory, driven by `starling bench serve` (random 4k-token prompts, 256 output
# tokens, EOS ignored):
#   roomy:  KV memory that holds 20 plain 4k requests at once, 20 concurrent  (target ≥ 1.0×)
#   bound:  KV memory where plain is memory-bound, 64 concurrent             (target ≥ 1.5×)
# Needs the SmolLM2 GGUF staged at $HOME/stage/smollm2.gguf (its tokenizer serves the API) or
# TOKENIZER=<alias/path>. Results in $OUT: serve_<arm>_<point>.{json,md}, serve_latent.md.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
TOKENIZER=${TOKENIZER:-$HOME/stage/smollm2.gguf}
LATENT_FLAGS=${LATENT_FLAGS:---synthetic-latent-share 0.5}
POINTS=${POINTS:-roomy bound}
date -u +%FT%TZ > "$OUT/date.txt"
summary=$OUT/serve_latent.md
echo "| point | arm | KV memory | concurrency | output tok/s | TPOT p50 ms | TTFT p50 ms | KV blocks | peak running | preemptions |" > "$summary"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" >> "$summary"
port=8021
for point in $POINTS; do
  case $point in
    roomy) mem=48GiB conc=20 prompts=40 ;;
    bound) mem=12GiB conc=64 prompts=64 ;;
  esac
  for arm in plain latent; do
    flags=()
    [ "$arm" = latent ] && flags=($LATENT_FLAGS)
    log=$OUT/serve_${arm}_$point.log
    $S serve --device cuda --load-format synthetic --model llama2-7b --tokenizer "$TOKENIZER" \
      --max-model-len 4096 --kv-cache-memory "$mem" --max-num-seqs 128 --port $port "${flags[@]}" > "$log" 2>&1 &
    pid=$!
    up=0
    wait_healthy "$port" "$pid" 120 && up=1
    if [ $up -ne 1 ]; then echo "$arm $point: server did not start"; tail -5 "$log"; kill $pid 2>/dev/null; continue; fi
    grep -iE "blocks|latent|bootable" "$log" | head -4
    timeout 240 $S bench serve --base-url http://127.0.0.1:$port --model llama2-7b --dataset random \
      --random-input-len 3584 --random-output-len 256 --random-range-ratio 0.1 --ignore-eos --seed 1 \
      --num-prompts $prompts --max-concurrency $conc \
      --output-json "$OUT/serve_${arm}_$point.json" --output-md "$OUT/serve_${arm}_$point.md" > /dev/null 2>&1
    python3 - "$OUT/serve_${arm}_$point.json" "$point" "$arm" "$mem" "$conc" >> "$summary" <<'EOF'
import json, sys
path, point, arm, mem, conc = sys.argv[1:]
try:
    run = json.load(open(path))["run"]
    m, s = run["metrics"], run.get("server") or {}
except Exception as e:
    print(f"| {point} | {arm} | {mem} | {conc} | failed: {e} | | | | | |"); sys.exit()
print(f"| {point} | {arm} | {mem} | {conc} | {m['output_throughput']:.0f} | {m['tpot']['median_ms']:.1f} | "
      f"{m['ttft']['median_ms']:.0f} | {s.get('kv_blocks_total', 'n/a')} | {s.get('peak_running', 'n/a')} | "
      f"{s.get('preemptions', 'n/a')} |")
EOF
    kill -TERM $pid; wait $pid 2>/dev/null
    port=$((port + 1))
  done
done
cat "$summary"
