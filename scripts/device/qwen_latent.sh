#!/usr/bin/env bash
# STAR-KV latents on the real Qwen2.5-Coder-1.5B (issue 15), on the H200. The GGUF is staged at
# $HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (../shared/tools/stage-chunks; 18 calls);
# .device/ holds starling, tests/ (scripts/device/build_gpu_tests.sh) and essays/.
#   1. calibrate the balanced and aggressive profiles (whitened SVD, no distillation: about a
#      minute; the ranks, not the training, decide what this compares) → $HOME/ckpt_latent;
#   2. the GPU test `real_model_latent_path_matches_the_reference_path` (logits, greedy);
#   3. NIAH 1k-30k through the reference path and through the latent path, cell by cell
#      (scripts/bench/compare_niah_outputs.py), and `starling info` of both at the same budget.
# Results in $OUT: calibrate.log, latent_test.log, niah_compare_<profile>.md, info_<profile>.txt,
# qwen_latent.tgz (NIAH reports).
#   PROFILES (default "balanced aggressive"), CONTEXTS (1k,4k,8k,16k,30k), DEPTHS (0,25,50,75,100).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PROFILES=${PROFILES:-balanced aggressive}
CONTEXTS=${CONTEXTS:-1k,4k,8k,16k,30k}
DEPTHS=${DEPTHS:-0,25,50,75,100}
gguf=$HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
ckpt=$HOME/ckpt_latent
work=$HOME/qwen_latent
mkdir -p "$work"
status=0
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c - || exit 1
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/date.txt"
if [ ! -f "$ckpt/balanced/manifest.json" ]; then
  timeout 240 .device/starling calibrate --device cuda --model "$gguf" \
    --profiles "$(echo $PROFILES | tr ' ' ,)" --distill-steps 0 --essays-dir .device/essays \
    --output "$ckpt" 2>&1 | grep -v "^\s*$" | tail -12 | tee "$OUT/calibrate.log"
fi
for p in $PROFILES; do cp "$ckpt/$p/manifest.json" "$work/manifest_$p.json" 2>/dev/null; done

test_bin=$(ls .device/tests/model_gpu-* | head -1)
STARLING_TEST_GGUF=$gguf STARLING_TEST_STARKV=$ckpt timeout 240 "$test_bin" --include-ignored \
  --exact real_model_latent_path_matches_the_reference_path --nocapture 2>&1 \
  | grep -v "^$" | tail -25 | tee "$OUT/latent_test.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

for p in $PROFILES; do
  for cache in reference latent; do
    kv="{\"method\":\"star_kv\",\"checkpoint\":\"$ckpt\",\"rank_profile\":\"$p\",\"cache\":\"$cache\"}"
    timeout 200 .device/starling bench niah --device cuda --model "$gguf" --contexts "$CONTEXTS" \
      --depths "$DEPTHS" --methods none --essays-dir .device/essays --kv-compression "$kv" \
      --output "$work/niah_${p}_$cache" 2>&1 | grep -A3 "facts found" | tail -2 || status=1
  done
  python3 scripts/bench/compare_niah_outputs.py "$work/niah_${p}_reference" "$work/niah_${p}_latent" \
    "$OUT/niah_compare_$p.md" --labels reference,latent | head -8
  kv="{\"method\":\"star_kv\",\"checkpoint\":\"$ckpt\",\"rank_profile\":\"$p\"}"
  .device/starling info --device cuda --model "$gguf" --kv-cache-memory 4GiB --max-model-len 32768 \
    --star-kv "$ckpt" --kv-compression "$kv" > "$OUT/info_$p.txt" 2>&1
  tail -4 "$OUT/info_$p.txt"
done
tar czf "$OUT/qwen_latent.tgz" -C "$HOME" qwen_latent
exit $status
