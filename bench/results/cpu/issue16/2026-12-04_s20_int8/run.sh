#!/usr/bin/env bash
# How this folder was made (CPU, 2 cores), from the repo root: --kv-cache-dtype int8 on
# SmolLM2-135M at the settings of ../2026-12-04_s19_fp8_latents (default bench quality windows,
# the default calibrate recipe's balanced and aggressive checkpoints, rebuilt here: the recipe is
# deterministic), so each row sits beside its fp8 and f32 row there; and the 50% torch-distilled
# checkpoint of ../2026-12-04_s20_torch_distill with int8 latents (that folder's eval settings).
set -u
R=bench/results/cpu/issue16/2026-12-04_s20_int8
S=target/release/starling
E=${ESSAYS:-.device/essays/paul-graham-essays}
W=${WORK:-target/tmp/s20_distill}
t() { /usr/bin/time -f "%e s" "$@"; }
q() { local name=$1; shift; t $S bench quality -m smollm2-135m --device cpu --methods none --essays-dir $E --output $R/$name "$@" > $R/$name.log 2>&1; echo "quality $name rc=$?"; }
t $S calibrate -m smollm2-135m --device cpu --profiles aggressive,balanced --essays-dir $E --output $W/smol_default > $R/calibrate.log 2>&1
echo "calibrate rc=$?"
q int8_dense --kv-cache-dtype int8
for p in balanced aggressive; do
  q ${p}_latent_int8 --kv-compression "{\"method\":\"star_kv\",\"checkpoint\":\"$W/smol_default\",\"rank_profile\":\"$p\"}" --kv-cache-dtype int8
done
ck="{\"method\":\"star_kv\",\"checkpoint\":\"$W/torch\",\"rank_profile\":\"removed-50pct\"}"
q torch_refined_50pct_int8 --context-tokens 1024 --eval-tokens 128 --num-windows 4 --kv-compression "$ck" --kv-cache-dtype int8
q torch_refined_50pct_fp8 --context-tokens 1024 --eval-tokens 128 --num-windows 4 --kv-compression "$ck" --kv-cache-dtype fp8
