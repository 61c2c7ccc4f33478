#!/usr/bin/env bash
# Issue 21, part 3: where a serving run's GPU time goes, per kernel, dense against each
# compressed cache. Synthetic Qwen2.5-Coder-1.5B behind `starling serve --kernel-profile`
# (every launch timed by site: kernel name, or cuBLAS call and weight shape), driven by
# `starling bench serve`, which diffs the server's per-site counters over the run and writes the
# table (launches, device ms, share, µs per launch) into its markdown and JSON. Two workloads,
# the two where the vLLM campaign (bench/results/gpu/issue21/2026-12-02_s12_vllm_campaign/) found
# gaps: random 1k in / 256 out at 16 concurrent (TPOT above vLLM's) and one 24k-token prompt
# (prefill 638 ms against vLLM's 401). Each arm also runs unprofiled with CUDA graphs (the
# throughput a user gets), so the profiled run's device time is set against real wall time.
#   carry [".device/starling", ".device/qtok.tgz"]  (scripts/device/make_tokenizer_qwen.sh)
#   ARMS="plain keydiff latent"   KV_MEM=8GiB   MODES="graphs profiled"
# An arm may carry an environment assignment for its server, `plain@STARLING_SKINNY_GEMM=0`
# (A/B of a backend switch in the same run). MODES="graphs" skips the profiled runs.
# Results in $OUT: kernel_profile.md (all tables) and runs.tgz (every run's JSON, markdown,
# client and server logs: the device tool brings back 8 files).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
TOK=${TOK:-.device/qwen_tokenizer}
[ "$TOK" != .device/qwen_tokenizer ] || qwen_tokenizer || exit 1
ARMS=${ARMS:-plain keydiff latent}
KV_MEM=${KV_MEM:-8GiB}
MODES=${MODES:-graphs profiled}
[ -x "$S" ] || { echo "missing $S"; exit 3; }
[ -s "$TOK/tokenizer.json" ] || { echo "missing $TOK/tokenizer.json"; exit 3; }
date -u +%FT%TZ > "$OUT/date.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUT/date.txt"
summary=$OUT/kernel_profile.md
echo "# Kernel profile of serving runs (synthetic Qwen2.5-Coder-1.5B, KV $KV_MEM, $(head -1 "$OUT/date.txt"))" > "$summary"
port=8031

# bench serve for one workload: name, then its dataset flags.
run_workload() {
  local name=$1; shift
  timeout 200 "$S" bench serve --base-url "http://127.0.0.1:$port" --model qwen --dataset random \
    --ignore-eos --seed 1 "$@" \
    --output-json "$OUT/$name.json" --output-md "$OUT/$name.md" > "$OUT/$name.stdout" 2>&1 \
    || echo "$name: bench exit $?"
  grep -E "output token throughput|TPOT mean|TTFT mean" "$OUT/$name.md" | sed "s/^/$name /"
}

for arm_spec in $ARMS; do
  arm=${arm_spec%%@*}
  env_assign=()
  [ "$arm_spec" != "$arm" ] && env_assign=("${arm_spec#*@}")
  label=$arm
  [ ${#env_assign[@]} -gt 0 ] && label="${arm}_${env_assign[0]//[^A-Za-z0-9]/_}"
  flags=()
  case $arm in
    plain) ;;
    keydiff) flags=(--kv-compression '{"method":"keydiff","ratio":0.5}') ;;
    latent) flags=(--synthetic-latent-share 0.5) ;;
    *) echo "unknown arm $arm"; continue ;;
  esac
  for mode in $MODES; do
    extra=()
    [ "$mode" = profiled ] && extra=(--kernel-profile)
    log=$OUT/server_${label}_$mode.log
    env "${env_assign[@]}" "$S" serve --device cuda --load-format synthetic --model qwen2.5-coder-1.5b --tokenizer "$TOK" \
      --served-model-name qwen --max-model-len 32768 --kv-cache-memory "$KV_MEM" \
      --max-num-seqs 256 --max-num-batched-tokens 8192 --port $port "${flags[@]}" "${extra[@]}" \
      > "$log" 2>&1 &
    pid=$!
    up=0
    wait_healthy "$port" "$pid" 90 && up=1
    if [ $up -ne 1 ]; then echo "$label $mode: server did not start"; tail -5 "$log"; kill $pid 2>/dev/null; port=$((port + 1)); continue; fi
    suffix=""
    [ "$mode" = profiled ] && suffix=_profiled
    run_workload "${label}_c16_1k${suffix}" --random-input-len 1024 --random-output-len 256 \
      --num-prompts 64 --max-concurrency 16
    run_workload "${label}_long24k${suffix}" --random-input-len 24000 --random-output-len 16 \
      --random-range-ratio 0 --num-prompts 2 --max-concurrency 1
    kill -TERM $pid; wait $pid 2>/dev/null
    port=$((port + 1))
  done
  for w in c16_1k long24k; do
    {
      echo; echo "## $label, $w"
      grep -E "output token throughput|TTFT mean|TPOT mean" "$OUT/${label}_$w.md" 2>/dev/null | sed 's/^/graphs on: /'
      sed -n '/### Device time per launch site/,$p' "$OUT/${label}_${w}_profiled.md" 2>/dev/null | head -45
    } >> "$summary"
  done
done
(cd "$OUT" && tar czf runs.tgz --exclude runs.tgz --exclude kernel_profile.md --exclude date.txt ./* \
  && find . -maxdepth 1 -type f ! -name runs.tgz ! -name kernel_profile.md ! -name date.txt -delete)
head -c 11000 "$summary"
