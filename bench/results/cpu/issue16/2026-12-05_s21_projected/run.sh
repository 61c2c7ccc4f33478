#!/usr/bin/env bash
# The threshold phase with the budget projected every step (`--distill-budget projected`) against
# session 20's dual-ascent row, same settings as its run_settings.sh
# (SmolLM2-135M, 50% removed, essays alone, 64 steps of one 512-token window, thresholds only,
# same evaluation). The dual row is session 20's `q_torch_essays` (+56.6%).
set -u
R=bench/results/cpu/issue16/2026-12-05_s21_projected
S=target/release/starling
E=${ESSAYS:-.device/essays/paul-graham-essays}
PY=${PY:-target/pyenv-hf/bin/python}
W=${WORK:-target/tmp/s21_projected}
t() { /usr/bin/time -f "%e s" "$@"; }
cal() { local name=$1; shift; t $S calibrate -m smollm2-135m --device cpu --profiles 50% --essays-dir $E --output $W/$name --distill-backend torch --python $PY --distill-tokens 32768 --distill-window-tokens 512 --distill-batch-windows 1 "$@" 2>&1 | grep -v -E "GGUF tensors|Loading weights|torch trainer is" > $R/calibrate_$name.log; echo "calibrate $name rc=$?"; cp $W/$name/removed-50pct/manifest.json $R/manifest_$name.json; cp $W/$name/.torch-job/removed-50pct/thresholds.json $R/thresholds_$name.json; }
q() { local name=$1; ck="{\"method\":\"star_kv\",\"checkpoint\":\"$W/$name\",\"rank_profile\":\"removed-50pct\"}"; t $S bench quality -m smollm2-135m --device cpu --methods none --context-tokens 1024 --eval-tokens 128 --num-windows 4 --essays-dir $E --kv-compression "$ck" --output $R/q_$name > $R/q_$name.log 2>&1; echo "quality $name rc=$?"; }
cal projected_essays --distill-text essays --distill-budget projected
q projected_essays
# The first projected version (shift only, no gradient projection) was run the same way; its
# files are *_shift_only*.
