#!/usr/bin/env bash
# How this folder was made (CPU, 2 cores), from the repo root, after
#   starling calibrate -m smollm2-135m --device cpu --output ckpt_smol --essays-dir <essays>
# (calibrate.log): dense fp8, and each STAR-KV profile's latents in f32 and in fp8, each
# against the uncompressed reference pass of the same run.
set -u
R=bench/results/cpu/issue16/2026-12-04_s19_fp8_latents
S=target/release/starling
E=${ESSAYS:-.device/essays/paul-graham-essays}
CKPT=${CKPT:-ckpt_smol}
q() { local name=$1; shift; /usr/bin/time -f "%e s" $S bench quality -m smollm2-135m --device cpu --methods none --essays-dir $E --output $R/$name "$@" > $R/$name.log 2>&1; echo "$name rc=$?"; }
q fp8_dense --kv-cache-dtype fp8
for p in balanced aggressive; do
  ck="{\"method\":\"star_kv\",\"checkpoint\":\"$CKPT\",\"rank_profile\":\"$p\"}"
  q ${p}_latent --kv-compression "$ck"
  q ${p}_latent_fp8 --kv-compression "$ck" --kv-cache-dtype fp8
done
