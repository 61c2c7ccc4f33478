#!/usr/bin/env bash
# How this folder was made (CPU, 2 cores), from the repo root: issue 16 item 2 — where the two
# small GQA models stop being compressible, at the real shares (15/35/50/60% of K/V bytes
# removed). Gemma-3-270M (1 KV head x 256 per layer): whitened SVD only (its q/k norms sit
# between x.A and RoPE: distillation and the latent cache refuse it), reference path.
# SmolLM2-135M (3 KV heads x 64): whitened SVD and the CPU distillation recipe (16 steps x 128
# tokens). Every row: bench quality on held-out essays, 4 windows of 1024 + 128 forced tokens,
# against the uncompressed pass of the same run (the settings of ../2026-12-04_s20_torch_distill).
set -u
R=bench/results/cpu/issue16/2026-12-05_s23_small_model_shares
S=target/release/starling
W=${WORK:-target/s23_shares}
mkdir -p "$W"
t() { /usr/bin/time -f "%e s" "$@"; }
cal() { # cal MODEL NAME [flags]: checkpoints for every share into $W/NAME
  local model=$1 name=$2; shift 2
  t $S calibrate -m "$model" --device cpu --profiles 15%,35%,50%,60% --output "$W/$name" "$@" 2>&1 \
    | grep -v -E "GGUF tensors|Loading weights" > "$R/calibrate_$name.log"
  echo "calibrate $name rc=$?"
}
q() { # q MODEL NAME SHARE: one quality row
  local model=$1 name=$2 share=$3
  local ck="{\"method\":\"star_kv\",\"checkpoint\":\"$W/$name\",\"rank_profile\":\"removed-${share}pct\",\"cache\":\"reference\"}"
  t $S bench quality -m "$model" --device cpu --methods none --context-tokens 1024 --eval-tokens 128 \
    --num-windows 4 --kv-compression "$ck" --output "$R/q_${name}_$share" > "$R/q_${name}_$share.log" 2>&1
  echo "quality $name $share rc=$?"
}
cal gemma3-270m gemma_svd --distill-steps 0
for s in 15 35 50 60; do q gemma3-270m gemma_svd $s; done
cal smollm2-135m smol_svd --distill-steps 0
cal smollm2-135m smol_cpu16 --distill-steps 16
for s in 15 35 60; do q smollm2-135m smol_svd $s; q smollm2-135m smol_cpu16 $s; done
# Qwen2.5-Coder-0.5B (2 KV heads x 64, 24 layers): the same KV head count as the 1.5B at a third
# of its size (run after the rows above, same settings).
if [ "${QWEN05:-1}" = 1 ]; then
  cal qwen2.5-coder-0.5b qwen05_svd --distill-steps 0
  for s in 15 35 50 60; do q qwen2.5-coder-0.5b qwen05_svd $s; done
fi
