#!/usr/bin/env bash
# Per-kernel times of the STAR-KV latent attention under Nsight Compute (issue 15): every
# kernel of `starling bench kernels --latent-only --quick` (the dense kernel of each point
# beside the latent launches), durations and DRAM bytes, summarised per kernel name and point.
# Carry [".device"] after scripts/device/build_gpu_tests.sh. Lands in $OUT.
# Give it a device call of its own: over the quick grid it ran past 300 s on the H100 (session
# 36). NCU_ARGS adds Nsight options, e.g. NCU_ARGS='--kernel-name regex:latent_' to profile only
# the latent kernels (the summary then lacks the dense rows).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
date -u +%FT%TZ | tee "$OUT/date.txt"
# shellcheck disable=SC2086 # NCU_ARGS is a list of options
timeout ${NCU_TIMEOUT:-400} "$ncu" --clock-control none --cache-control none ${NCU_ARGS:-} \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  .device/starling bench kernels --latent-only --quick > "$OUT/latent_ncu.csv" 2> "$OUT/latent_ncu.err" \
  || echo "ncu: exit $?"
python3 scripts/bench/ncu_latent_summary.py "$OUT/latent_ncu.csv" | tee "$OUT/latent_kernels.md"
