#!/usr/bin/env bash
# Automatic prefix caching on the H200 (issue 19): synthetic llama2-7b behind `starling serve`,
# caching on against off, driven by `starling bench serve`:
#   sharing: vLLM's prefix_repetition shape (8 prefixes of 3072 tokens, 256-token suffixes,
#            128 outputs, 16 requests per prefix, 16 concurrent): TTFT p50 off / on
#            (target >= 3x at a hit rate >= 80%)
#   none:    random 1024-token prompts, nothing shared (128 outputs, 32 concurrent): output
#            tokens/s on / off (target: no loss beyond 2%)
# each point also run with every request evicting (KeyDiff 0.5) when EVICT=1: hit rate beside
# the dense cache's. Needs the SmolLM2 GGUF at $HOME/stage/smollm2.gguf (its tokenizer serves
# the API) or TOKENIZER=<alias/path>. Results in $OUT: serve_prefix.md and serve_prefix.tgz
# (<point>_<arm>.{json,md,log} — the device tool returns at most 8 files).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
TOKENIZER=${TOKENIZER:-$HOME/stage/smollm2.gguf}
POINTS=${POINTS:-sharing none}
ARMS=${ARMS:-off on}
MEM=${MEM:-40GiB}
RUN=${RUN:-$HOME/serve_prefix}
mkdir -p "$RUN"
date -u +%FT%TZ > "$RUN/date.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$RUN/date.txt"
summary=$OUT/serve_prefix.md
echo "| point | arm | requests | concurrency | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | prefix hit rate | forked blocks |" > "$summary"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" >> "$summary"
port=8041
for point in $POINTS; do
  case $point in
    sharing) conc=16 workload=(--dataset prefix_repetition --num-prompts 128 --prefix-repetition-num-prefixes 8
               --prefix-repetition-prefix-len 3072 --prefix-repetition-suffix-len 256 --prefix-repetition-output-len 128) ;;
    none) conc=32 workload=(--dataset random --num-prompts 128 --random-input-len 1024 --random-output-len 128
               --random-range-ratio 0.1) ;;
  esac
  for arm in $ARMS; do
    case $arm in
      off) flags=(--no-enable-prefix-caching) ;;
      on) flags=(--enable-prefix-caching) ;;
      # STAR-KV-shaped latents (random factors, 50% of the K/V bytes) in every layer.
      on-latent) flags=(--enable-prefix-caching --synthetic-latent-share 0.5) ;;
      on-latent-evict) flags=(--enable-prefix-caching --synthetic-latent-share 0.5
                              --kv-compression '{"method":"keydiff","ratio":0.5}') ;;
      on-evict) flags=(--enable-prefix-caching --kv-compression '{"method":"keydiff","ratio":0.5}') ;;
      off-evict) flags=(--no-enable-prefix-caching --kv-compression '{"method":"keydiff","ratio":0.5}') ;;
      # A step budget above the prompts: their compressions come once the prompt is in, so a
      # compressing request may reuse the whole cached prefix (see ARCHITECTURE.md, compaction
      # points).
      on-evict-b4096) flags=(--enable-prefix-caching --kv-compression '{"method":"keydiff","ratio":0.5}'
                             --max-num-batched-tokens 4096) ;;
      off-evict-b4096) flags=(--no-enable-prefix-caching --kv-compression '{"method":"keydiff","ratio":0.5}'
                              --max-num-batched-tokens 4096) ;;
    esac
    log=$RUN/${point}_$arm.log
    $S serve --device cuda --load-format synthetic --model llama2-7b --tokenizer "$TOKENIZER" \
      --max-model-len 4096 --kv-cache-memory "$MEM" --max-num-seqs 64 --port $port "${flags[@]}" > "$log" 2>&1 &
    pid=$!
    up=0
    wait_healthy "$port" "$pid" 120 && up=1
    if [ $up -ne 1 ]; then echo "$point $arm: server did not start"; tail -5 "$log"; kill $pid 2>/dev/null; continue; fi
    timeout 200 $S bench serve --base-url http://127.0.0.1:$port --model llama2-7b "${workload[@]}" \
      --ignore-eos --seed 1 --max-concurrency $conc \
      --output-json "$RUN/${point}_$arm.json" --output-md "$RUN/${point}_$arm.md" > "$RUN/${point}_$arm.bench.log" 2>&1
    forked=$(python3 -c "import urllib.request as u; t=u.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode(); print(next((l.split()[-1] for l in t.splitlines() if l.startswith('starling:kv_compaction_forked_blocks_total')), 'n/a'))" 2>/dev/null)
    python3 - "$RUN/${point}_$arm.json" "$point" "$arm" "$conc" "${forked:-n/a}" >> "$summary" <<'PY'
import json, sys
path, point, arm, conc, forked = sys.argv[1:]
try:
    run = json.load(open(path))["run"]
    m, s = run["metrics"], run.get("server") or {}
except Exception as e:
    print(f"| {point} | {arm} | | {conc} | failed: {e} | | | | | |"); sys.exit()
hit = s.get("prefix_cache_hit_rate_pct")
hit = f"{hit:.1f}%" if isinstance(hit, (int, float)) else "n/a"
print(f"| {point} | {arm} | {m.get('completed', 'n/a')} | {conc} | {m['output_throughput']:.0f} | "
      f"{m['ttft']['median_ms']:.0f} | {m['ttft']['p99_ms']:.0f} | {m['tpot']['median_ms']:.1f} | {hit} | {forked} |")
PY
    kill -TERM $pid; wait $pid 2>/dev/null
    port=$((port + 1))
  done
done
cp "$summary" "$RUN/"
tar czf "$OUT/serve_prefix.tgz" -C "$RUN" .
cat "$summary"
