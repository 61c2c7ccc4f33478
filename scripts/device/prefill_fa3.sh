#!/usr/bin/env bash
# Issue 21: Starling's prefill attention on whole prompts (the shape of a serving step's prefill)
# against FlashAttention-2 and vLLM's FlashAttention-3 on the same card, in one call: where the
# per-step gap to vLLM sits (session 27: ~2.5x FA3's time per 4k prompt in a serving profile).
# Staging as for vllm_profile.sh (the vLLM wheel pieces and the two dependency halves, see
# vllm_campaign.sh's header), then one call:
#   carry [".device/starling", ".device/qwen_tokenizer", ".device/sharegpt.json", ".device/vparts/SHA256SUMS"]
#   command: bash scripts/device/prefill_fa3.sh
# (S=<path> for a binary staged elsewhere.) Starling runs once per tiled prefill kernel
# (STARLING_PREFILL_KERNEL: wgmma, the Hopper kernel, then mma), same binary and card.
# $OUT: date.txt, starling_prefill_{wgmma,mma}.{json,md} (`bench kernels --prompt-prefill`),
# baseline.json (FA2, FA3), prefill_{wgmma,mma}.md (joined, ratios).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
S=${S:-.device/starling}
# The folder vllm_campaign.sh installs the vLLM wheels into (its SITE=…, one definition).
SITE=$(sed -n 's/^SITE=//p' scripts/device/vllm_campaign.sh)
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/date.txt"
status=0
# Steps 1-3 of the campaign script (inputs checked, vLLM installed); without them the FA3 rows
# say why they are missing and the rest still runs.
SETUP_ONLY=1 S=$S bash scripts/device/vllm_campaign.sh || { echo "vLLM setup failed"; status=1; }
for kernel in wgmma mma; do
  STARLING_PREFILL_KERNEL=$kernel timeout 300 "$S" bench kernels --prompt-prefill \
    --output "$OUT/starling_prefill_$kernel.json" | tee "$OUT/starling_prefill_$kernel.md" || status=1
done
PYTHONPATH=$SITE timeout 240 python3 scripts/bench/prefill_baseline.py "$OUT/baseline.json" \
  --starling "$OUT/starling_prefill_wgmma.json" "$OUT/prefill_wgmma.md" \
  --starling "$OUT/starling_prefill_mma.json" "$OUT/prefill_mma.md" > "$OUT/baseline.log" 2>&1 \
  || status=1
tail -20 "$OUT/baseline.log"
exit $status
