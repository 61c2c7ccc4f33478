#!/usr/bin/env bash
# The torch backend against the CPU (candle) distiller, step for step: the same model, factors,
# windows (file order) and thresholds; both in f32 on the CPU. Prints each backend's per-step KL
# (from the manifests' loss curves) and whether the distilled ranks are identical.
#   bash scripts/check_torch_distill.sh [MODEL] [STEPS]      (PY: python with torch + transformers)
set -euo pipefail
model=${1:-smollm2-135m}
steps=${2:-3}
py=${PY:-target/pyenv-hf/bin/python}
starling=${STARLING:-target/release/starling}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(-m "$model" --device cpu --profiles aggressive --distill-window-tokens 128 --calibration-tokens 2048)
"$starling" calibrate "${common[@]}" --distill-steps "$steps" --output "$work/cpu" > /dev/null
"$starling" calibrate "${common[@]}" --distill-backend torch --python "$py" --distill-in-file-order --distill-budget dual \
  --distill-batch-windows 1 --distill-tokens $((steps * 128)) --output "$work/torch" > /dev/null 2>&1
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
m = {b: json.load(open(f"{work}/{b}/aggressive/manifest.json")) for b in ("cpu", "torch")}
for b in m:
    print(b.ljust(6), " ".join(f"{p['kl']:.6f}" for p in m[b]["loss_curve"]))
worst = max(abs(a["kl"] - b["kl"]) / max(abs(a["kl"]), 1e-12)
            for a, b in zip(m["cpu"]["loss_curve"], m["torch"]["loss_curve"]))
same = m["cpu"]["layers"] == m["torch"]["layers"]
print(f"largest relative KL difference {worst:.2e}; ranks identical: {same}")
sys.exit(0 if same and worst < 1e-3 else 1)
PY
