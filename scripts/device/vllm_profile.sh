#!/usr/bin/env bash
# Issue 21: where vLLM's and Starling's GPU time goes at one serving point, per kernel, in one
# call on the same card — to explain a per-step gap such as session 25's (H100, random 4096 /
# 128 at 16 concurrent, 0.75 GiB of KV: Starling TPOT +10% over vLLM 0.26 at the same batch).
#
# vLLM: its torch profiler (`--profiler-config`, POST /start_profile and /stop_profile), which
# writes `profiler_out_0.txt` (kernels by self CUDA time) on stop; profiling is limited to
# PROFILE_ITERS engine steps after SKIP_ITERS, so the trace stays small. Starling: the same
# workload against `starling serve --kernel-profile` (every launch timed by site; decode steps
# run eager under it), whose table `bench serve` writes into its markdown. Both arms also run
# unprofiled first (vLLM with CUDA graphs, Starling with its graphs), the throughput a user
# gets, on the same server instance before profiling starts (vLLM) or on its own server
# (Starling).
#
# Staging as for vllm_campaign.sh (its header lists the calls: the vLLM wheel pieces, the two
# dependency halves), then one call:
#   carry [".device/starling", ".device/qtok.tgz", ".device/sharegpt.json", ".device/vparts/SHA256SUMS"]
#   command: bash scripts/device/vllm_profile.sh
# Knobs: KV_MEM (0.75GiB), IN (4096), OUTLEN (128), MAX_LEN (8192: both servers' context window;
# raise it with IN, e.g. IN=24512 OUTLEN=64 MAX_LEN=24576 for the context campaign's 24k point), CONC (16), PROMPTS (64), SKIP_ITERS (50),
# PROFILE_ITERS (300), STARLING_MODES ("graphs profiled": the binary's defaults; a suffix sets
# choices for an A/B in the same call: "-wgmma" (or "-ws") the Hopper prefill kernel
# (STARLING_PREFILL_KERNEL=wgmma, the default on Hopper), "-mma" the mma.sync one, "-bias" the linear layers' bias in
# the cuBLASLt GEMM's epilogue (STARLING_GEMM_BIAS_EPILOGUE=1), "-sepbias" in a launch of its own,
# "-epiall" the epilogue at every row count (the default again since session 34), "-nowarm"
# no boot-time warm-up (--warm-up-tokens 0), "-keeppool" the memory pool keeps freed memory
# (STARLING_MEMPOOL_RELEASE_THRESHOLD=max), "-kdir" kernels compiled from the directory $KDIR
# (STARLING_KERNEL_DIR: e.g. an older attention.cu beside the current headers), "-splits128"
# (any number) the attention plan's most splits a (row, KV head) (STARLING_ATTENTION_MAX_SPLITS),
# "-nogate" (with profiled) sites timed without the host gate (STARLING_PROFILE_GATE=0: host
# time inside a site counted whenever the stream drained, as before session 34),
# e.g. "graphs graphs-wgmma-bias profiled-wgmma-bias"), SKIP_VLLM (1: Starling's modes only, no
# vLLM staged; the synthetic model is still made). Results in $OUT: vllm_profile.md (both tables and the unprofiled figures) and
# vllm_profile.tgz (every run's JSON / markdown and the server logs).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
qwen_tokenizer || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
# The folder vllm_campaign.sh installs the vLLM wheels into (its SITE=…, one definition).
SITE=$(sed -n 's/^SITE=//p' scripts/device/vllm_campaign.sh)
KV_MEM=${KV_MEM:-0.75GiB}
IN=${IN:-4096}
OUTLEN=${OUTLEN:-128}
MAX_LEN=${MAX_LEN:-8192}
CONC=${CONC:-16}
PROMPTS=${PROMPTS:-64}
SKIP_ITERS=${SKIP_ITERS:-50}
PROFILE_ITERS=${PROFILE_ITERS:-300}
RUN=$HOME/vllm_profile
PROF_DIR=$HOME/vllm_torch_profile
rm -rf "$RUN" "$PROF_DIR"
mkdir -p "$RUN" "$PROF_DIR"
md=$OUT/vllm_profile.md
trap 'tar czf "$OUT/vllm_profile.tgz" -C "$RUN" . 2>/dev/null' EXIT

# Steps 1-3 of the campaign script: inputs checked, vLLM installed, the synthetic model made.
SETUP_ONLY=1 bash scripts/device/vllm_campaign.sh || { echo "setup failed"; exit 3; }
kv_bytes=$(python3 -c "
s='$KV_MEM'.strip(); u={'GiB':1<<30,'MiB':1<<20,'KiB':1<<10}
print(next((int(float(s[:-3])*m) for k,m in u.items() if s.endswith(k)), None) or int(s))")
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$RUN/env.txt"
{
  echo "# Per-kernel GPU time, vLLM 0.26 vs Starling ($(sed -n 2p "$RUN/env.txt"), $(head -1 "$RUN/env.txt"))"
  echo
  echo "random $IN in / $OUTLEN out, $PROMPTS prompts at concurrency $CONC, KV $KV_MEM ($kv_bytes bytes) each,"
  echo "8192 tokens per step, 256 sequences, synthetic Qwen2.5-Coder-1.5B, ignore EOS, seed 0."
} > "$md"

# bench serve against the server on PORT: name, port.
workload() {
  local name=$1 port=$2
  timeout 240 "$S" bench serve --base-url "http://127.0.0.1:$port" --model qwen --dataset random \
    --random-input-len "$IN" --random-output-len "$OUTLEN" --num-prompts "$PROMPTS" \
    --max-concurrency "$CONC" --ignore-eos --seed 0 \
    --output-json "$RUN/$name.json" --output-md "$RUN/$name.md" > "$RUN/$name.stdout" 2>&1 \
    || echo "$name: bench exit $?"
  { echo; echo "## $name"; grep -E "output token throughput|TTFT mean|TPOT mean" "$RUN/$name.md"; } >> "$md"
}
post() { python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$1$2', method='POST'), timeout=600)"; }

# vLLM: unprofiled run, then the profiled one on the same server (SKIP_VLLM=1: none).
port=8051
if [ "${SKIP_VLLM:-0}" != 1 ]; then
profiler_config="{\"profiler\":\"torch\",\"torch_profiler_dir\":\"$PROF_DIR\",\"torch_profiler_with_stack\":false,\"torch_profiler_use_gzip\":false,\"ignore_frontend\":true,\"delay_iterations\":$SKIP_ITERS,\"max_iterations\":$PROFILE_ITERS}"
env PYTHONPATH="$SITE" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 python3 -m vllm.entrypoints.openai.api_server --model "$HOME/qwen_syn" \
  --served-model-name qwen --port $port --max-model-len "$MAX_LEN" --kv-cache-memory-bytes "$kv_bytes" \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --seed 0 --profiler-config "$profiler_config" \
  > "$RUN/vllm_server.log" 2>&1 &
vpid=$!
if wait_healthy $port $vpid 300; then
  workload vllm $port
  post $port /start_profile && workload vllm_profiled $port && post $port /stop_profile \
    || echo "vLLM profiling failed (server log: vllm_server.log)"
  cp "$PROF_DIR"/profiler_out_*.txt "$RUN/" 2>/dev/null
  { echo; echo "### vLLM kernels by self CUDA time ($PROFILE_ITERS steps after $SKIP_ITERS)"; echo '```'
    head -60 "$PROF_DIR"/profiler_out_0.txt 2>/dev/null || echo "no profiler_out_0.txt"; echo '```'; } >> "$md"
else
  echo "vLLM did not start"; tail -20 "$RUN/vllm_server.log"
fi
kill -INT $vpid 2>/dev/null; sleep 5; kill -9 $vpid 2>/dev/null; wait $vpid 2>/dev/null
fi

# Starling: unprofiled (graphs on), then --kernel-profile, one server each.
for mode in ${STARLING_MODES:-graphs profiled}; do
  port=$((port + 1))
  extra=()
  choices=()
  case $mode in profiled*) extra=(--kernel-profile) ;; esac
  case $mode in *-wgmma* | *-ws*) choices+=(STARLING_PREFILL_KERNEL=wgmma) ;; esac
  case $mode in *-mma*) choices+=(STARLING_PREFILL_KERNEL=mma) ;; esac
  case $mode in *-bias*) choices+=(STARLING_GEMM_BIAS_EPILOGUE=1) ;; esac
  case $mode in *-sepbias*) choices+=(STARLING_GEMM_BIAS_EPILOGUE=0) ;; esac
  case $mode in *-epiall*) choices+=(STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS=1000000) ;; esac
  case $mode in *-nowarm*) extra+=(--warm-up-tokens 0) ;; esac
  case $mode in *-keeppool*) choices+=(STARLING_MEMPOOL_RELEASE_THRESHOLD=max) ;; esac
  case $mode in *-nogate*) choices+=(STARLING_PROFILE_GATE=0) ;; esac
  case $mode in *-splits[0-9]*)
    n=${mode##*-splits}; choices+=(STARLING_ATTENTION_MAX_SPLITS="${n%%-*}") ;; esac
  case $mode in *-kdir*) choices+=(STARLING_KERNEL_DIR="$(cd "${KDIR:?-kdir needs KDIR}" && pwd)") ;; esac
  env "${choices[@]}" "$S" serve --device cuda --model "$HOME/qwen_syn" --served-model-name qwen --port $port \
    --max-model-len "$MAX_LEN" --kv-cache-memory "$KV_MEM" --max-num-seqs 256 --max-num-batched-tokens 8192 \
    "${extra[@]}" > "$RUN/starling_server_$mode.log" 2>&1 &
  spid=$!
  if wait_healthy $port $spid 120; then
    workload "starling_$mode" $port
  else
    echo "Starling ($mode) did not start"; tail -5 "$RUN/starling_server_$mode.log"
  fi
  kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
done
for prof in "$RUN"/starling_profiled*.md; do
  [ -e "$prof" ] || continue
  { echo; echo "### Starling device time per launch site ($(basename "$prof" .md))"
    sed -n '/Device time per launch site/,$p' "$prof" | head -40; } >> "$md"
done
cat "$md"
