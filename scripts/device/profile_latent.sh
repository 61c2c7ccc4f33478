#!/usr/bin/env bash
# Per-kernel times of the STAR-KV latent attention under Nsight Compute (issue 15): every
# kernel of `starling bench kernels --latent-only --quick` (the dense kernel of each point
# beside the latent launches), durations and DRAM bytes, summarised per kernel name and point.
# Carry [".device"] after scripts/device/build_gpu_tests.sh. Lands in $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
date -u +%FT%TZ | tee "$OUT/date.txt"
timeout ${NCU_TIMEOUT:-400} "$ncu" --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  .device/starling bench kernels --latent-only --quick > "$OUT/latent_ncu.csv" 2> "$OUT/latent_ncu.err" \
  || echo "ncu: exit $?"
python3 scripts/bench/ncu_latent_summary.py "$OUT/latent_ncu.csv" | tee "$OUT/latent_kernels.md"
