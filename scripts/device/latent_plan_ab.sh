#!/usr/bin/env bash
# Latent decode A/Bs on the GPU (issue 15), in one device call, with one binary:
#   tests     the latent parity (every score kernel on eager plans) and decode graphs with latent
#             layers of two shapes (each shape's split plan read from the replay buffer), again
#             with each of SCORE_KERNELS;
#   bench     `starling bench kernels --latent-only --quick` once per STARLING_LATENT_SPLITS
#             tuning in TUNINGS (`default` = the built-in constants: backend/latent_plan.rs);
#   variants  each of VARIANTS ("name:DEFINE=value,..." of kernels/latent.cu): a copy of the
#             kernel sources with those #defines rewritten (STARLING_KERNEL_DIR), its latent
#             parity, then the same bench; the built-in sources' bench runs first as `builtin`;
#   kernels   the same bench with each score kernel of SCORE_KERNELS (STARLING_LATENT_SCORES,
#             default `wgmma`: latent_wgmma.cu, Hopper) beside `builtin`;
#   nsight    Nsight Compute `--set full` of one launch per launch shape of NCU_KERNELS (regex,
#             default the d128 bf16 score kernels) for `builtin` and each of NSIGHT_ARMS
#             (variants as in VARIANTS, score kernels as scores_NAME): nsight.md
#             (scripts/bench/ncu_full_summary.py: stalls, hit rates, pipe activity); ~1–2 min
#             an arm.
# All benches are summarised side by side in summary.md.
#   here:  bash scripts/device/build_gpu_tests.sh
#   there: bash scripts/device/latent_plan_ab.sh [tests] [bench] [variants]
#          (carry .device/starling, .device/tests/parity-*, .device/tests/graphs_gpu-*)
# Results in $OUT: tests.log, summary.md, nsight.md, ab.tgz (each run's JSON + markdown, each
# Nsight arm's raw CSV).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
parts=${*:-tests bench}
TUNINGS=${TUNINGS:-"default 14,3,2,0 14,3,2,512"}
# LS_PASSES (2, 4: fewer registers, more blocks per SM): no win with every key at position 0,
# 1.12–1.20x on MHA at full grids with keys at their positions (H100, session 37).
# LS_ROPE_SPLIT: RoPE rows composed from the table row of p − p mod LS_ROPE_LO and a shared row
# of p mod LS_ROPE_LO, positions staged with the tile (ptxas, d128: 142 registers, 8.7 KB static
# shared memory at LO 16). LS_SLOT_AHEAD: the block-table lookup one iteration early. LS_STAGES /
# LW_STAGES: the rings of the two score kernels (the host sizes shared memory from the compiled
# define). Also tried by hand: ropesplit64:LS_ROPE_SPLIT=1,LS_ROPE_LO=64, slotahead:LS_SLOT_AHEAD=1.
SCORE_KERNELS=${SCORE_KERNELS:-"wgmma"}
# Nsight arms beside `builtin`: variants (name:DEFINES) and score kernels (scores_NAME).
NSIGHT_ARMS=${NSIGHT_ARMS:-"ropesplit:LS_ROPE_SPLIT=1 scores_wgmma"}
VARIANTS=${VARIANTS:-"ropesplit:LS_ROPE_SPLIT=1 ropesplit_ahead:LS_ROPE_SPLIT=1,LS_SLOT_AHEAD=1 passes4_rope:LS_PASSES=4,LS_ROPE_SPLIT=1,LS_SLOT_AHEAD=1 stages3:LS_STAGES=3,LS_ROPE_SPLIT=1,LS_SLOT_AHEAD=1 wg_stages3:LW_STAGES=3"}
S=${S:-.device/starling}
# A variant's defines live in latent.cu (LS_*) or latent_wgmma.cu (LW_*: its bench and Nsight
# arms then run the wgmma score kernel).
LATENT_FILES=latent.cu,latent_wgmma.cu
variant_kernel() { [[ ",$1" == *",LW_"* ]] && echo STARLING_LATENT_SCORES=wgmma; }
work=$(mktemp -d)
trap 'tar czf "$OUT/ab.tgz" -C "$work" .' EXIT
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  | tee "$OUT/date.txt"
status=0
arms=()
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
bench() { # arm name, env assignments...
  local name=$1; shift
  echo "== bench $name $*" | tee -a "$OUT/tests.log"
  env "$@" timeout 240 "$S" bench kernels --latent-only --quick \
    --output "$work/$name.json" > "$work/$name.md" 2>&1 || { status=1; tail -3 "$work/$name.md"; }
  arms+=("$name")
}
parity=$(ls .device/tests/parity-* 2>/dev/null | head -1)
if [[ " $parts " == *" tests "* ]]; then
  graphs=$(ls .device/tests/graphs_gpu-* | head -1)
  one "parity latent" "$parity" --include-ignored --test-threads=1 --nocapture latent
  one "graphs latent" "$graphs" --include-ignored --test-threads=1 --nocapture latent
  # The same decode graphs with each opt-in score kernel (replay reads the split plan words).
  for k in $SCORE_KERNELS; do
    one "graphs latent, $k" env STARLING_LATENT_SCORES="$k" \
      "$graphs" --include-ignored --test-threads=1 --nocapture latent
  done
fi
if [[ " $parts " == *" bench "* ]]; then
  for t in $TUNINGS; do
    if [ "$t" = default ]; then bench default; else bench "${t//,/_}" STARLING_LATENT_SPLITS="$t"; fi
  done
fi
if [[ " $parts " == *" variants "* ]]; then
  bench builtin
  for v in $VARIANTS; do
    name=${v%%:*}
    dir=$work/kernels_$name
    kernel_variant "$dir" "$LATENT_FILES" "${v#*:}" || { status=1; continue; }
    echo "$name: ${v#*:}" >> "$OUT/tests.log"
    one "parity latent, $name" env STARLING_KERNEL_DIR="$dir" \
      "$parity" --include-ignored --test-threads=1 --nocapture latent
    bench "$name" STARLING_KERNEL_DIR="$dir" $(variant_kernel "${v#*:}")
  done
fi
if [[ " $parts " == *" kernels "* ]]; then
  # Each score kernel of SCORE_KERNELS (STARLING_LATENT_SCORES) beside the built-in default;
  # the latent parity (tests) covers every kernel.
  [[ " ${arms[*]:-} " == *" builtin "* ]] || bench builtin
  for k in $SCORE_KERNELS; do bench "scores_$k" STARLING_LATENT_SCORES="$k"; done
fi
if [[ " $parts " == *" nsight "* ]]; then
  # Nsight Compute `--set full` of one launch per distinct launch shape of the kernels matching
  # NCU_KERNELS, for the built-in sources and each variant (their directories from `variants`,
  # or made here): stalls, hit rates, pipe activity side by side in nsight.md.
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for v in builtin $NSIGHT_ARMS; do
    name=${v%%:*}
    envs=()
    if [[ "$name" == scores_* ]]; then
      envs=(STARLING_LATENT_SCORES="${name#scores_}")
    elif [ "$name" != builtin ]; then
      dir=$work/kernels_$name
      [ -d "$dir" ] || kernel_variant "$dir" "$LATENT_FILES" "${v#*:}" || { status=1; continue; }
      envs=(STARLING_KERNEL_DIR="$dir" $(variant_kernel "${v#*:}"))
    fi
    echo "== nsight $name" | tee -a "$OUT/tests.log"
    env "${envs[@]}" timeout "${NCU_TIMEOUT:-150}" "$ncu" --set full --clock-control none \
      --filter-mode per-launch-config --kernel-name "regex:${NCU_KERNELS:-latent_scores_(d128|wg_d128)_bf16}" \
      --launch-skip 5 --launch-count 1 -o "$work/$name" \
      "$S" bench kernels --latent-only --quick > "$work/$name.ncu.log" 2>&1 || status=1
    "$ncu" --import "$work/$name.ncu-rep" --page raw --csv > "$work/$name.raw.csv" 2>/dev/null
    python3 scripts/bench/ncu_full_summary.py "$work/$name.raw.csv" "$name" \
      | { [ "$name" = builtin ] && cat || tail -n +3; } >> "$OUT/nsight.md"
    rm -f "$work/$name.ncu-rep"  # tens of MB: the raw CSV keeps every metric
  done
  cat "$OUT/nsight.md"
fi
if [ ${#arms[@]} -gt 0 ]; then
  python3 - "$work" "${arms[@]}" > "$OUT/summary.md" <<'EOF'
import sys
work, arms = sys.argv[1], sys.argv[2:]
rows = {}
for arm in arms:
    try:
        lines = open(f"{work}/{arm}.md").read().splitlines()
    except OSError:
        continue
    for line in lines:
        c = [x.strip() for x in line.strip().strip('|').split('|')]
        if len(c) == 9 and c[1] == 'decode':
            key = (c[0], f"{c[2]} × {c[3]}")
            rows.setdefault(key, {})[arm] = (float(c[5]), float(c[6]))
print("latent ms per arm (STARLING_LATENT_SPLITS tuning score_value_share_long, or kernel "
      "variant); latent/dense speed of each run\n")
print("| shape | batch × seq | " + " | ".join(arms) + " |")
print("|---|---|" + "---:|" * len(arms))
for (shape, point), by in rows.items():
    cells = []
    for arm in arms:
        if arm in by:
            lat, den = by[arm]
            cells.append(f"{lat:.4f} ({den / lat:.2f}×)")
        else:
            cells.append("–")
    print(f"| {shape} | {point} | " + " | ".join(cells) + " |")
EOF
  cat "$OUT/summary.md"
fi
echo "status $status" | tee -a "$OUT/tests.log"
exit $status
