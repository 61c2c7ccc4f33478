#!/usr/bin/env bash
# Issue 15's latent split plan (backend/latent_plan.rs) on the GPU, in one device call:
#   1. tests: the latent parity (every score kernel on eager plans), decode graphs with latent
#      layers of two shapes (each shape's plan read from the replay buffer), and the prefill
#      parity of the WS_STAGES 4 variant of the Hopper prefill kernel (STARLING_KERNEL_DIR);
#   2. bench: `starling bench kernels --latent-only --quick` once per STARLING_LATENT_SPLITS
#      tuning (`default` = the built-in constants), summarised side by side.
#   here:  bash scripts/device/build_gpu_tests.sh
#   there: bash scripts/device/latent_plan_ab.sh [tests] [bench]
#          (carry .device/starling, .device/tests/parity-*, .device/tests/graphs_gpu-*)
# Results in $OUT: tests.log, summary.md, ab.tgz (each run's JSON + markdown).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
parts=${*:-tests bench}
TUNINGS=${TUNINGS:-"default 8,2,4 4,1,2 16,4,2 8,4,1"}
S=${S:-.device/starling}
work=$(mktemp -d)
trap 'tar czf "$OUT/ab.tgz" -C "$work" .' EXIT
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  | tee "$OUT/date.txt"
status=0
one() { # label, command...
  local label=$1; shift
  echo "== $label" | tee -a "$OUT/tests.log"
  timeout 300 "$@" > "$work/one.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  grep -E 'rel|^test |panicked|test result' "$work/one.log" | grep -v ' \.\.\. ok$' \
    >> "$OUT/tests.log"
  grep -E '^test result|panicked' "$work/one.log" | head -5
  echo "rc $rc" | tee -a "$OUT/tests.log"
}
if [[ " $parts " == *" tests "* ]]; then
  parity=$(ls .device/tests/parity-* | head -1)
  graphs=$(ls .device/tests/graphs_gpu-* | head -1)
  one "parity latent" "$parity" --include-ignored --test-threads=1 --nocapture latent
  one "graphs latent" "$graphs" --include-ignored --test-threads=1 --nocapture latent
  # The WS_STAGES 4 variant: a copy of the kernel sources with the one #define rewritten.
  variant=$work/kernels_stages4
  cp -r crates/starling-cuda/kernels "$variant"
  sed -i 's/^#define WS_STAGES [0-9]*/#define WS_STAGES 4/' "$variant/prefill_wgmma.cu"
  grep -n '^#define WS_STAGES' "$variant/prefill_wgmma.cu" | tee -a "$OUT/tests.log"
  one "parity prefill, WS_STAGES 4" env STARLING_KERNEL_DIR="$variant" \
    "$parity" --include-ignored --test-threads=1 --nocapture prefill
fi
if [[ " $parts " == *" bench "* ]]; then
  for t in $TUNINGS; do
    name=${t//,/_}
    envs=()
    [ "$t" = default ] || envs=(STARLING_LATENT_SPLITS="$t")
    echo "== bench $t" | tee -a "$OUT/tests.log"
    env "${envs[@]}" timeout 240 "$S" bench kernels --latent-only --quick \
      --output "$work/$name.json" > "$work/$name.md" 2>&1 || { status=1; tail -3 "$work/$name.md"; }
  done
  python3 - "$work" $TUNINGS > "$OUT/summary.md" <<'EOF'
import sys
work, tunings = sys.argv[1], sys.argv[2:]
rows = {}
for t in tunings:
    try:
        lines = open(f"{work}/{t.replace(',', '_')}.md").read().splitlines()
    except OSError:
        continue
    for line in lines:
        c = [x.strip() for x in line.strip().strip('|').split('|')]
        if len(c) == 9 and c[1] == 'decode':
            key = (c[0], f"{c[2]} × {c[3]}")
            rows.setdefault(key, {})[t] = (float(c[5]), float(c[6]))
print("latent ms per STARLING_LATENT_SPLITS tuning (score,value,share); dense ms and "
      "latent/dense speed of each run\n")
print("| shape | batch × seq | " + " | ".join(tunings) + " |")
print("|---|---|" + "---:|" * len(tunings))
for (shape, point), by in rows.items():
    cells = []
    for t in tunings:
        if t in by:
            lat, den = by[t]
            cells.append(f"{lat:.4f} ({den / lat:.2f}×)")
        else:
            cells.append("–")
    print(f"| {shape} | {point} | " + " | ".join(cells) + " |")
EOF
  cat "$OUT/summary.md"
fi
echo "status $status" | tee -a "$OUT/tests.log"
exit $status
