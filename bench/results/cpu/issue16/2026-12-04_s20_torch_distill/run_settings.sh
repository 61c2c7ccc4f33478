#!/usr/bin/env bash
# The two suspects of the torch thresholds row (+85.9% vs the CPU recipe's +73.1%), one at a
# time, same 32k tokens of 512-token windows, thresholds only (no refinement), same evaluation
# as run.sh: (a) the essays alone as text, dual rate 2.0; (b) essays + chat, dual rate 0.5.
set -u
R=bench/results/cpu/issue16/2026-12-04_s20_torch_distill
S=target/release/starling
E=${ESSAYS:-.device/essays/paul-graham-essays}
PY=${PY:-target/pyenv-hf/bin/python}
W=${WORK:-target/tmp/s20_distill}
t() { /usr/bin/time -f "%e s" "$@"; }
cal() { local name=$1; shift; t $S calibrate -m smollm2-135m --device cpu --profiles 50% --essays-dir $E --output $W/$name --distill-backend torch --python $PY --distill-tokens 32768 --distill-window-tokens 512 --distill-batch-windows 1 "$@" 2>&1 | grep -v -E "GGUF tensors|Loading weights" > $R/calibrate_$name.log; echo "calibrate $name rc=$?"; cp $W/$name/removed-50pct/manifest.json $R/manifest_$name.json; }
q() { local name=$1; ck="{\"method\":\"star_kv\",\"checkpoint\":\"$W/$name\",\"rank_profile\":\"removed-50pct\"}"; t $S bench quality -m smollm2-135m --device cpu --methods none --context-tokens 1024 --eval-tokens 128 --num-windows 4 --essays-dir $E --kv-compression "$ck" --output $R/q_$name > $R/q_$name.log 2>&1; echo "quality $name rc=$?"; }
cal torch_essays --distill-text essays
q torch_essays
cal torch_dual05 --distill-dual-rate 0.5
q torch_dual05
