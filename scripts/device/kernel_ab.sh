#!/usr/bin/env bash
# Kernel A/Bs in one device call, with one binary and no rebuild:
#   1. the projections' GEMMs (`bench kernels --gemm`) with the bias-epilogue row limit at its
#      default, at every row count (1000000) and at none (0): STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS;
#   2. the Hopper prefill kernel's compile-time knobs: each variant is a copy of the kernel
#      sources with `#define`s rewritten, compiled at run time (STARLING_KERNEL_DIR) and timed on
#      the prompt-prefill rows (`bench kernels --prompt-prefill`) beside the built-in sources,
#      the arms in turn PREFILL_REPEATS (3) times, summarised by scripts/bench/prefill_ab_summary.py;
#   3. the attention plan's split bound (STARLING_ATTENTION_MAX_SPLITS) on the quick kernel grid,
#      whose 1 × 32k decode row is where it binds, with the FA2 baseline once.
# carry [".device/starling"]; command: bash scripts/device/kernel_ab.sh [gemm|prefill|splits]...
# (all three when none is named). Results in $OUT: kernel_ab.tgz (one JSON + markdown per run)
# and summary.md (the device tool brings back at most 8 files a call, so the runs travel tarred).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
S=${S:-.device/starling}
parts=${*:-gemm prefill splits}
# Prefill variants: name:DEFINE=value,... (prefill_wgmma.cu), space-separated. Check a variant
# compiles here first: STARLING_KERNEL_DIR=<copy> PTXAS=<ptxas> bash scripts/nvrtc_check.sh
# (registers and spills). Not worth a device run (ptxas, 2026-12-07): more consumer registers
# (producer 24 or 32 → consumer 240: the producer spills 40 / 24 bytes while the consumers at
# 232 spill nothing) and BN 128 × 3 stages (132 bytes spilled; 2–8% slower in session 30).
# WS_STAGES 4 is built in since session 36 (median 1.010× and 1.016× over 6 in sessions 34/35).
PREFILL_VARIANTS=${PREFILL_VARIANTS:-"nopingpong:WS_PINGPONG=0 stages6:WS_STAGES=6"}
PREFILL_REPEATS=${PREFILL_REPEATS:-3}
SPLIT_BOUNDS=${SPLIT_BOUNDS:-"128"}
FINAL=$OUT
OUT=$(mktemp -d)
trap 'tar czf "$FINAL/kernel_ab.tgz" -C "$OUT" . && cp "$OUT/summary.md" "$FINAL/" 2>/dev/null' EXIT
date -u +%FT%TZ | tee "$OUT/date.txt"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || echo "no nvidia-smi"; } | tee "$OUT/gpu.txt"
summary=$OUT/summary.md
echo "# kernel_ab.sh: $parts ($(cat "$OUT/gpu.txt"))" > "$summary"

run() { # name, env assignments..., -- , bench args...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "## $name ${envs[*]}" | tee -a "$summary"
  env "${envs[@]}" "$S" bench kernels "$@" --output "$OUT/$name.json" > "$OUT/$name.md" 2>&1 \
    || { echo "failed: $(tail -3 "$OUT/$name.md")" | tee -a "$summary"; return 0; }
  grep '^|' "$OUT/$name.md" >> "$summary" || true
}

for part in $parts; do
  case $part in
    gemm)
      run gemm_default -- --gemm
      run gemm_epilogue_all STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS=1000000 -- --gemm
      run gemm_epilogue_none STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS=0 -- --gemm
      ;;
    prefill)
      # Each variant's kernel files, made once.
      declare -A variant_dir=()
      for v in $PREFILL_VARIANTS; do
        name=${v%%:*}
        dir=$(mktemp -d)/kernels
        kernel_variant "$dir" prefill_wgmma.cu "${v#*:}" || exit 1
        variant_dir[$name]=$dir
      done
      # Arms in turn, PREFILL_REPEATS times, so drift (clocks, heat) falls on every arm alike;
      # the builtin arm's own spread is the noise floor.
      for r in $(seq 1 "$PREFILL_REPEATS"); do
        run "prefill_builtin_r$r" -- --prompt-prefill
        for name in "${!variant_dir[@]}"; do
          run "prefill_${name}_r$r" STARLING_KERNEL_DIR="${variant_dir[$name]}" -- --prompt-prefill
        done
      done
      python3 scripts/bench/prefill_ab_summary.py "$OUT" | tee "$OUT/prefill_ab.md" >> "$summary"
      ;;
    splits)
      run splits_default -- --quick
      for n in $SPLIT_BOUNDS; do
        run "splits_$n" STARLING_ATTENTION_MAX_SPLITS="$n" -- --quick
      done
      python3 scripts/bench/fa2_baseline.py "$OUT/fa2.json" --quick > "$OUT/fa2.log" 2>&1 \
        && python3 scripts/bench/merge_kernels.py "$OUT/splits_default.json" "$OUT/fa2.json" \
          "$OUT/splits_default_vs_fa2.md" || echo "FA2 baseline failed: $(tail -2 "$OUT/fa2.log")"
      ;;
    *) echo "unknown part: $part (gemm, prefill, splits)" >&2; exit 2 ;;
  esac
done
