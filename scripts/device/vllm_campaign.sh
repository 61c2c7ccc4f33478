#!/usr/bin/env bash
# Issue 21 on the H200: the serving campaigns (`starling bench campaign`) against Starling and
# vLLM 0.26.0 on the same GPU, the same synthetic Qwen2.5-Coder-1.5B and the same KV memory,
# measured in one run (about 7 minutes of the 10 a call allows; vLLM boots in ~100 s).
#
# Engines (run one after another; each server is stopped before the next boots):
#   starling          plain K/V
#   vllm              vLLM 0.26.0's OpenAI api_server from the carried wheels
#   starling-keydiff  token eviction, KeyDiff at ratio 0.5
# KV memory: every engine gets KV_MEM bytes through its own flag (Starling --kv-cache-memory,
# vLLM --kv-cache-memory-bytes, which replaces --gpu-memory-utilization's profiling). Both
# cache 28 layers × 2 × 2 kv heads × 128 × 2 bytes = 28,672 bytes per token in 16-token
# blocks, so 0.75 GiB is 1,755 blocks (28,080 tokens) in each; the boots record the figures
# each server reports (Starling's kv_cache card, vLLM's vllm:cache_config_info num_gpu_blocks).
# Same scheduler limits on both: 256 sequences, 8192 tokens per step.
# Context campaign: Starling boots per point ({max_model_len}): at 32768 plain K/V is refused
# (one sequence needs 0.875 GiB), KeyDiff boots (its peak under eviction fits). vLLM serves
# every point at its one boot (a boot costs ~100 s) at --max-model-len 24576, the largest
# multiple of 8k its 28,080 tokens hold (a 32768 boot would be refused as plain Starling's is),
# so its 32768 row says "requests refused".
#
# Prepared HERE first (all under .device/, git-ignored): `bash scripts/device/stage_vllm.sh`,
# which downloads and splits the wheels, makes the tokenizer and the ShareGPT subset, and
# prints these calls. Then, back to back (the machine is given back after 30 s idle):
#   calls 1..N  carry [".device/vparts/vllm.partK"]   (one piece each, K = 00..N-1, two digits)
#               command: mkdir -p $HOME/vw && cp .device/vparts/vllm.partK $HOME/vw/ && ls -l $HOME/vw
#   calls N+1, N+2  carry [".device/vdeps/a"], then [".device/vdeps/b"] (the 79 other wheels)
#               command: mkdir -p $HOME/vw && cp .device/vdeps/a/*.whl $HOME/vw/ && ls $HOME/vw | wc -l  (b alike)
#   call N+3    carry [".device/starling", ".device/qtok.tgz", ".device/sharegpt.json", ".device/vparts/SHA256SUMS"]
#               command: bash scripts/device/vllm_campaign.sh
# Results: $OUT/vllm_campaign.tgz (campaign.json, campaign.md, PNGs, every server's log) and
# $OUT/campaign.md. Knobs: KV_MEM (0.75GiB), LIMIT (seconds for this call, 570), CAMPAIGNS (all,
# or e.g. concurrency), FP8=1 (adds starling-fp8, starling-fp8-keydiff and vllm-fp8: both
# engines' `--kv-cache-dtype fp8`; NO_KEYDIFF=1 drops starling-keydiff), ENGINES (a comma list
# naming which of those engines run, in that order; default: what FP8/NO_KEYDIFF give;
# starling-readmit: plain Starling with `--admission-policy optimistic-readmit`, an A/B engine;
# starling-latent, starling-latent-fp8, starling-latent-fp8-keydiff: STAR-KV latents at
# LATENT_SHARE (0.5) of the K/V elements with random factors, `--load-format synthetic` of the
# same shapes, alone, with an fp8 cache, and with KeyDiff on top),
# KEYDIFF_RATIO (0.5), BATCHED_TOKENS (8192, every engine's tokens per step), VLLM_MAX_LEN
# (24576: vLLM's one boot must fit KV_MEM, so a small budget needs a small value),
# REQ_PER_CONC (1) and MAX_REQ (128) (requests per concurrency point: more averages out a
# point's noise), and the grids below (CONC_POINTS, CTX_POINTS, LONG_POINTS, RATES,
# CONC_WORKLOADS, LONG_INPUT, CTX_OUTPUT). SETUP_ONLY=1 stops after step 3 (the install and the
# synthetic model), for scripts that serve vLLM their own way (vllm_profile.sh); with SKIP_VLLM=1
# as well, only the inputs and the synthetic model (no vLLM staged: Starling-only A/B runs).
# DRY_RUN=1 (a check on the CPU machine, no vLLM): S=<starling binary> MODEL=<an HF dir>
# OUT=<dir>, tiny grids; only step 4 runs, with the two Starling engines on --device cpu.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
DRY_RUN=${DRY_RUN:-0}
TOK=.device/qwen_tokenizer
qwen_tokenizer || exit 1
SHAREGPT=.device/sharegpt.json
SUMS=.device/vparts/SHA256SUMS
VW=$HOME/vw
MODEL=${MODEL:-\$HOME/qwen_syn}   # kept literal: the servers' shell expands it
SITE=/tmp/vsite
RUN=.device/vllm_campaign   # relative: the recorded command names no machine path
KV_MEM=${KV_MEM:-0.75GiB}
LIMIT=${LIMIT:-570}
CONC_POINTS=${CONC_POINTS:-1,16,128}
CTX_POINTS=${CTX_POINTS:-8192,24576,32768}
LONG_POINTS=${LONG_POINTS:-256,2048,4096}
RATES=${RATES:-4,16}
CONC_WORKLOADS=${CONC_WORKLOADS:-random:1024:256,random:4096:128}
LONG_INPUT=${LONG_INPUT:-128}
CTX_OUTPUT=${CTX_OUTPUT:-64}
CAMPAIGNS=${CAMPAIGNS:-all}
FP8=${FP8:-0}
NO_KEYDIFF=${NO_KEYDIFF:-0}
ENGINES=${ENGINES:-}
KEYDIFF_RATIO=${KEYDIFF_RATIO:-0.5}
BATCHED_TOKENS=${BATCHED_TOKENS:-8192}
VLLM_MAX_LEN=${VLLM_MAX_LEN:-24576}
REQ_PER_CONC=${REQ_PER_CONC:-1}
MAX_REQ=${MAX_REQ:-128}
DEVICE=cuda
[ "$DRY_RUN" = 1 ] && DEVICE=cpu
WHEEL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl

# 1. Inputs, fast: exit 3 naming what is missing.
if [ "$DRY_RUN" != 1 ]; then
missing=()
[ -x "$S" ] || missing+=("$S (cargo build --release -p starling-cli; strip into .device/)")
[ -s "$TOK/tokenizer.json" ] || missing+=("$TOK/tokenizer.json (scripts/device/make_tokenizer_qwen.sh)")
# ShareGPT feeds the scheduler campaign only: a context-only call need not carry it (3.3 MB of
# the 64 MiB a call may carry).
case ",$CAMPAIGNS," in
  *,all,* | *,scheduler,*) [ -s "$SHAREGPT" ] || missing+=("$SHAREGPT (scripts/device/stage_vllm.sh)") ;;
esac
[ -s "$SUMS" ] || missing+=("$SUMS (scripts/device/stage_vllm.sh)")
if [ "${SKIP_VLLM:-0}" != 1 ]; then
if [ ! -s "$VW/$WHEEL" ]; then
  parts=$(find "$VW" -maxdepth 1 -name 'vllm.part*' 2>/dev/null | wc -l)
  want=$(grep -c 'vllm.part' "$SUMS" 2>/dev/null || echo '?')
  [ "$parts" = "$want" ] || missing+=("$VW/vllm.part* ($parts of $want pieces staged)")
fi
deps=0
for w in "$VW"/*.whl; do
  [ -e "$w" ] && [ "${w##*/}" != "$WHEEL" ] && deps=$((deps + 1))
done
[ "$deps" -ge 79 ] || missing+=("$VW/*.whl ($deps of 79 dependency wheels staged)")
fi
python3 -c "import torch, transformers, safetensors" 2>/dev/null || missing+=("python3 with torch + transformers")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'missing: %s\n' "${missing[@]}"
  exit 3
fi

mkdir -p "$RUN"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > "$RUN/env.txt" 2>&1

# 2. The vLLM wheel, joined and checked; the set installed to $SITE (8 s).
if [ "${SKIP_VLLM:-0}" != 1 ]; then
if [ ! -s "$VW/$WHEEL" ]; then
  cat "$VW"/vllm.part* > "$VW/$WHEEL.tmp" && mv "$VW/$WHEEL.tmp" "$VW/$WHEEL"
fi
(cd "$VW" && grep " $WHEEL\$" "$OLDPWD/$SUMS" | sha256sum -c -) || { echo "the joined vLLM wheel does not match its sha256"; rm -f "$VW/$WHEEL"; exit 3; }
if [ ! -d "$SITE/vllm-0.26.0.dist-info" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$VW"/*.whl \
    || { echo "pip install of the wheel set failed"; exit 4; }
fi
echo "vllm $(PYTHONPATH=$SITE python3 -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -1)" | tee -a "$RUN/env.txt"
fi

# 3. The synthetic Qwen2.5-Coder-1.5B directory (random bf16 weights, real tokenizer).
if [ ! -s "$HOME/qwen_syn/model.safetensors" ]; then
  python3 scripts/device/make_synthetic_qwen.py "$TOK" "$HOME/qwen_syn" || { echo "making the model failed"; exit 4; }
fi
fi # DRY_RUN
# SETUP_ONLY=1: steps 1-3 only (vllm_profile.sh reuses them).
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0
mkdir -p "$RUN"

# 4. The campaigns, within what is left of this call (SIGINT stops the servers and keeps the
#    rows measured so far).
SERVE="$S serve --device $DEVICE --model $MODEL --served-model-name qwen --port {port} \
--max-model-len {max_model_len} --kv-cache-memory {kv_cache_memory_bytes} --max-num-seqs 256 \
--max-num-batched-tokens $BATCHED_TOKENS"
# STAR-KV latents without a checkpoint: the same shapes built on the device with random weights
# and random latent factors keeping LATENT_SHARE of every layer's K/V elements (capacity and
# speed only; quality is issue 16's, on the real model).
SYN_SERVE="$S serve --device $DEVICE --load-format synthetic --model qwen2.5-coder-1.5b --tokenizer $TOK \
--synthetic-latent-share ${LATENT_SHARE:-0.5} --served-model-name qwen --port {port} \
--max-model-len {max_model_len} --kv-cache-memory {kv_cache_memory_bytes} --max-num-seqs 256 \
--max-num-batched-tokens $BATCHED_TOKENS"
# $VSITE kept literal (the servers' shell expands it), so recorded commands name no machine path.
export VSITE=$SITE
VLLM="env PYTHONPATH=\$VSITE VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
VLLM_NO_USAGE_STATS=1 python3 -m vllm.entrypoints.openai.api_server --model $MODEL \
--served-model-name qwen --port {port} --max-model-len $VLLM_MAX_LEN --kv-cache-memory-bytes {kv_cache_memory_bytes} \
--max-num-seqs 256 --max-num-batched-tokens $BATCHED_TOKENS --seed 0"
remain=$((LIMIT - SECONDS - 25))
echo "== campaigns (${remain} s left)"
KEYDIFF="--kv-compression '{\"method\":\"keydiff\",\"ratio\":$KEYDIFF_RATIO}'"
declare -A command=(
  [starling]="$SERVE" [vllm]="$VLLM" [starling-keydiff]="$SERVE $KEYDIFF"
  [starling-fp8-keydiff]="$SERVE --kv-cache-dtype fp8 $KEYDIFF"
  [starling-fp8]="$SERVE --kv-cache-dtype fp8" [vllm-fp8]="$VLLM --kv-cache-dtype fp8"
  [starling-readmit]="$SERVE --admission-policy optimistic-readmit"
  [starling-latent]="$SYN_SERVE" [starling-latent-fp8]="$SYN_SERVE --kv-cache-dtype fp8"
  [starling-latent-fp8-keydiff]="$SYN_SERVE --kv-cache-dtype fp8 $KEYDIFF")
if [ -z "$ENGINES" ]; then
  ENGINES=starling,vllm
  [ "$NO_KEYDIFF" = 1 ] || ENGINES+=,starling-keydiff
  [ "$FP8" = 1 ] && ENGINES+=,starling-fp8-keydiff,starling-fp8,vllm-fp8
fi
engines=()
for name in ${ENGINES//,/ }; do
  [ -n "${command[$name]:-}" ] || { echo "unknown engine $name (${!command[*]})"; exit 2; }
  [ "$DRY_RUN" = 1 ] && [[ $name == vllm* ]] && continue
  engines+=(--engine "$name=${command[$name]}")
done
timeout -s INT -k 30 "$remain" "$S" bench campaign "${engines[@]}" \
  --campaigns "$CAMPAIGNS" --kv-cache-memory "$KV_MEM" --max-model-len 8192 --seed 0 --output-root "$RUN" \
  --boot-timeout-s 300 --point-timeout-s 120 \
  --concurrency-workloads "$CONC_WORKLOADS" --concurrency-points "$CONC_POINTS" \
  --requests-per-concurrency "$REQ_PER_CONC" --min-requests 4 --max-requests "$MAX_REQ" \
  --context-points "$CTX_POINTS" --context-output-tokens "$CTX_OUTPUT" --context-requests 2 \
  --long-generation-points "$LONG_POINTS" --long-generation-input-tokens "$LONG_INPUT" --long-generation-requests 8 \
  --scheduler-rates "$RATES" --scheduler-workload "sharegpt:$SHAREGPT" --scheduler-requests 32 \
  > "$RUN/campaign.stdout" 2> "$RUN/campaign.stderr"
echo "campaign exit status $?"

# 5. Results.
latest=$(find "$RUN" -mindepth 1 -maxdepth 1 -type d -name '2*' | sort | tail -1)
tar czf "$OUT/vllm_campaign.tgz" -C "$RUN" .
[ -n "$latest" ] && cp "$latest/campaign.md" "$OUT/campaign.md"
grep -E "up in|refused|timed out|error" "$RUN/campaign.stderr" | tail -20
[ -n "$latest" ] && head -c 9000 "$latest/campaign.md"
