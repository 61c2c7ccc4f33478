#!/usr/bin/env bash
# How this folder was made (CPU, 2 cores), from the repo root: --kv-cache-dtype int4 (a
# half-precision scale per 32 elements of each KV head row or latent, per token, in a
# Hadamard-rotated basis) on SmolLM2-135M at the settings of ../2026-12-04_s20_int8 (default bench
# quality windows, 4 x 2048 + 128; the default calibrate recipe's balanced and aggressive
# checkpoints, rebuilt: the recipe is deterministic), so each row sits beside its int8, fp8 and
# f32 rows there; and a whitened-SVD 50% checkpoint at the ablation's settings (4 x 1024 + 128)
# in f32, int8 and int4. unrotated_121d273/: the dense and balanced int4 rows made the same way
# by commit 121d273, before the rotation.
set -u
R=bench/results/cpu/issue16/2026-12-06_s25_int4
S=target/release/starling
W=${WORK:-target/s25_int4}
mkdir -p "$W"
t() { /usr/bin/time -f "%e s" "$@"; }
q() { local name=$1; shift; t $S bench quality -m smollm2-135m --device cpu --methods none --output $R/$name "$@" > $R/$name.log 2>&1; echo "quality $name rc=$?"; }
[ -d "$W/smol_default/balanced" ] || {
  t $S calibrate -m smollm2-135m --device cpu --profiles aggressive,balanced --output $W/smol_default > $R/calibrate.log 2>&1
  echo "calibrate rc=$?"
}
q dense_int4 --kv-cache-dtype int4
[ -f $R/dense_int8.log ] || q dense_int8 --kv-cache-dtype int8
for p in balanced aggressive; do
  q ${p}_latent_int4 --kv-compression "{\"method\":\"star_kv\",\"checkpoint\":\"$W/smol_default\",\"rank_profile\":\"$p\"}" --kv-cache-dtype int4
done
[ -d "$W/smol_svd50" ] || {
  t $S calibrate -m smollm2-135m --device cpu --profiles 50% --distill-steps 0 --output $W/smol_svd50 > $R/calibrate_svd50.log 2>&1
  echo "calibrate svd50 rc=$?"
}
ck="{\"method\":\"star_kv\",\"checkpoint\":\"$W/smol_svd50\",\"rank_profile\":\"removed-50pct\"}"
for d in int4 int8 auto; do
  q svd50_latent_$d --context-tokens 1024 --eval-tokens 128 --num-windows 4 --kv-compression "$ck" --kv-cache-dtype $d
done
