#!/usr/bin/env bash
# How this folder was made (CPU, 2 cores, PyTorch 2.11 CPU + transformers 5.17 in a venv), from
# the repo root: SmolLM2-135M at 50% of K/V bytes removed, at equal bytes: whitened SVD only; the
# CPU (candle) recipe of 16 distillation steps x 128 tokens; the torch backend's thresholds
# (32k tokens) and, on top, refined factors (32k tokens); each checkpoint's held-out perplexity
# against the uncompressed reference pass of the same run.
set -u
R=bench/results/cpu/issue16/2026-12-04_s20_torch_distill
S=target/release/starling
E=${ESSAYS:-.device/essays/paul-graham-essays}
PY=${PY:-target/pyenv-hf/bin/python}
W=${WORK:-target/tmp/s20_distill}
mkdir -p "$W"
t() { /usr/bin/time -f "%e s" "$@"; }
cal() { local name=$1; shift; t $S calibrate -m smollm2-135m --device cpu --profiles 50% --essays-dir $E --output $W/$name "$@" 2>&1 | grep -v -E "GGUF tensors|Loading weights" > $R/calibrate_$name.log; echo "calibrate $name rc=$?"; cp $W/$name/removed-50pct/manifest.json $R/manifest_$name.json; }
q() { local name=$1 dir=$2; ck="{\"method\":\"star_kv\",\"checkpoint\":\"$dir\",\"rank_profile\":\"removed-50pct\"}"; t $S bench quality -m smollm2-135m --device cpu --methods none --context-tokens 1024 --eval-tokens 128 --num-windows 4 --essays-dir $E --kv-compression "$ck" --output $R/q_$name > $R/q_$name.log 2>&1; echo "quality $name rc=$?"; }
cal svd --distill-steps 0
cal cpu16 --distill-steps 16
cal torch --distill-backend torch --python $PY --distill-tokens 32768 --refine-tokens 32768 --distill-window-tokens 512 --distill-batch-windows 1
cp $W/torch/.torch-job/removed-50pct/thresholds.json $W/torch/.torch-job/removed-50pct/refine.json $R/
q svd $W/svd
q cpu16 $W/cpu16
q torch_thresholds $W/torch/.torch-job/removed-50pct/unrefined
q torch_refined $W/torch
