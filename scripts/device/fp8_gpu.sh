#!/usr/bin/env bash
# The fp8 dense cache (`--kv-cache-dtype fp8`, issue 16) on the device machine, from the repo
# root. Here first: bash scripts/device/build_gpu_tests.sh and
# bash scripts/device/make_tokenizer_qwen.sh (the real Qwen2 tokenizer for the synthetic
# models' prompts); carry [".device/starling", ".device/tests", ".device/qwen_tokenizer"].
#   MODE=tests    the fp8 parity tests, then every GPU test binary (tests.log)
#   MODE=kernels  `bench kernels --quick` (bf16 and fp8 rows, same run) + FA2, merged (kernels.md)
#   MODE=serve    `bench serve` at equal KV memory, memory-bound: plain, fp8, KeyDiff@0.5 and
#                 fp8 + KeyDiff@0.5 on synthetic Qwen2.5-Coder-1.5B and llama2-7b (serve.tgz)
#   MODE=quality  `bench quality` of the real Qwen2.5-Coder-1.5B (GGUF=<path> on the device; the
#                 essays carried in .device/essays): bf16 reference vs fp8 alone and fp8 with
#                 KeyDiff / SnapKV @0.5, at each per-layer key-bias limit of LIMITS (the layers
#                 over it stay bf16; 1e9 = every layer fp8), plus `starling info` per limit
#                 (quality.tgz)
# Everything lands in $OUT (the device tool returns at most 8 files: runs are tarred).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
S=${S:-.device/starling}
TOK=${TOK:-.device/qwen_tokenizer}
MODE=${MODE:-tests}
OUT=${OUT:-/tmp/fp8_out}
mkdir -p "$OUT"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> "$OUT/date.txt"

run_tests() {
  local status=0 log="$OUT/tests.log"
  for t in .device/tests/parity-*; do
    echo "== $t fp8" | tee -a "$log"
    "$t" --include-ignored --test-threads=1 --nocapture fp8 >> "$log" 2>&1 || status=1
  done
  for t in .device/tests/*; do
    echo "== $t" | tee -a "$log"
    "$t" --include-ignored --test-threads=1 --skip real_model --skip hf_tiny_gpu >> "$log" 2>&1 \
      || status=1
    tail -3 "$log"
  done
  grep -E "^test result|FAILED|panicked" "$log" | tail -40
  return $status
}

run_kernels() {
  $S bench kernels --quick --output "$OUT/kernels.json" > "$OUT/kernels.stdout" 2>&1 || return 1
  python3 scripts/bench/fa2_baseline.py "$OUT/fa2.json" --quick > "$OUT/fa2.stdout" 2>&1
  python3 scripts/bench/merge_kernels.py "$OUT/kernels.json" "$OUT/fa2.json" "$OUT/kernels.md"
  grep -A 40 "fp8 cache" "$OUT/kernels.md" | head -60
}

# serve_arm NAME MODEL KV MAXLEN INPUT OUTPUT PROMPTS EXTRA_FLAGS...
serve_arm() {
  local name=$1 model=$2 kv=$3 maxlen=$4 input=$5 output=$6 prompts=$7
  shift 7
  port=$((port + 1))
  $S serve --device cuda --load-format synthetic --model "$model" --tokenizer "$TOK" \
    --served-model-name "$model" --max-model-len "$maxlen" --kv-cache-memory "$kv" \
    --port $port "$@" > "$OUT/runs/serve_${name}.log" 2>&1 &
  local pid=$!
  if ! wait_healthy "$port" "$pid" 180; then
    echo "== $name: server did not start"; tail -5 "$OUT/runs/serve_${name}.log"; return 1
  fi
  echo "== $name: $model, KV $kv, $input in / $output out, $prompts prompts at once, $*"
  timeout 300 $S bench serve --base-url http://127.0.0.1:$port --model "$model" --dataset random \
    --random-input-len "$input" --random-output-len "$output" --ignore-eos --seed 5 \
    --num-prompts "$prompts" --max-concurrency "$prompts" \
    --output-json "$OUT/runs/${name}.json" > "$OUT/runs/${name}.md" 2>&1
  tail -16 "$OUT/runs/${name}.md"
  python3 -c "import urllib.request as u; print('\n'.join(l for l in u.urlopen('http://127.0.0.1:$port/metrics').read().decode().splitlines() if l.startswith('starling:kv_cache_info') or l.startswith('starling:num_preemptions')))" \
    >> "$OUT/runs/${name}.md"
  kill -TERM $pid; wait $pid
}

run_serve() {
  mkdir -p "$OUT/runs"
  port=8030
  local keydiff='{"method":"keydiff","ratio":0.5}'
  for arm in "plain" "fp8 --kv-cache-dtype fp8" "keydiff --kv-compression $keydiff" \
             "fp8_keydiff --kv-cache-dtype fp8 --kv-compression $keydiff"; do
    set -- $arm
    local name=$1; shift
    serve_arm "qwen1.5b_$name" qwen2.5-coder-1.5b 1GiB 8192 4096 256 64 \
      --max-num-batched-tokens 8192 "$@"
    serve_arm "llama7b_$name" llama2-7b 8GiB 4096 3072 256 48 --max-num-batched-tokens 4096 "$@"
  done
  tar -C "$OUT" -czf "$OUT/serve.tgz" runs && rm -rf "$OUT/runs"
}

run_quality() {
  local gguf=${GGUF:?GGUF=<the real Qwen2.5-Coder-1.5B gguf on the device>}
  local essays=${ESSAYS:-.device/essays/paul-graham-essays}
  mkdir -p "$OUT/quality"
  for limit in ${LIMITS:-32 64 1e9}; do
    local methods=none,keydiff@0.5,snapkv@0.5
    [ "$limit" = 1e9 ] && methods=none
    echo "== key-bias limit $limit"
    STARLING_FP8_MAX_KEY_BIAS=$limit $S info -m "$gguf" --device cuda --kv-cache-dtype fp8 \
      --kv-cache-memory 1GiB > "$OUT/quality/info_$limit.txt" 2>&1
    tail -1 "$OUT/quality/info_$limit.txt"
    STARLING_FP8_MAX_KEY_BIAS=$limit $S bench quality -m "$gguf" --device cuda \
      --kv-cache-dtype fp8 --methods "$methods" --context-tokens 4096 --eval-tokens 256 \
      --num-windows 6 --essays-dir "$essays" --output "$OUT/quality/limit_$limit" \
      > "$OUT/quality/limit_$limit.log" 2>&1
    cat "$OUT/quality/limit_$limit/quality.md" 2>/dev/null || tail -5 "$OUT/quality/limit_$limit.log"
  done
  tar -C "$OUT" -czf "$OUT/quality.tgz" quality && rm -rf "$OUT/quality"
}

case "$MODE" in
  tests) run_tests ;;
  kernels) run_kernels ;;
  serve) run_serve ;;
  quality) run_quality ;;
  *) echo "MODE=tests|kernels|serve|quality" >&2; exit 2 ;;
esac
