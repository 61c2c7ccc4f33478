#!/usr/bin/env bash
# Per-kernel GPU times under Nsight Compute on the device machine (carry [".device"] after
# scripts/device/build_gpu_tests.sh): every kernel of a batch-1 synthetic llama2-7b decode step
# (durations and DRAM bytes, caches not flushed, clocks not locked), and the full metric set of
# one large prefill-attention launch (batch 4, 8k context, 512-token chunk, MHA). Lands in $OUT.
set -euo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
date -u +%FT%TZ | tee "$OUT/date.txt"
model=${MODEL:-llama2-7b}
# Eager and graph-replayed steps alike; the summary cuts one step out of the kernel stream.
timeout 300 "$ncu" --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  .device/starling bench decode --models "$model" --batch-sizes 1 --contexts 512 --steps 2 \
  > "$OUT/decode_ncu.csv" 2> "$OUT/decode_ncu.err" || echo "ncu decode: exit $?"
python3 scripts/bench/ncu_summary.py "$OUT/decode_ncu.csv" | tee "$OUT/decode_kernels.md"
# The 4th prefill shape of the MHA grid (8k × batch 4 × chunk 512): 3 shapes × 23 launches before.
if [ -z "${SKIP_PREFILL:-}" ]; then
  timeout 240 "$ncu" --set full --kernel-name regex:prefill_attention_d128 --launch-skip 69 \
    --launch-count 1 .device/starling bench kernels --quick > "$OUT/prefill_ncu.txt" 2>&1 \
    || echo "ncu prefill: exit $?"
  grep -E "Duration|Throughput|Registers|Achieved Occupancy|Warp Cycles|Issue Slots|Stall|Block Size|Grid Size|Executed Ipc|Tensor|Bank" \
    "$OUT/prefill_ncu.txt" | head -60 || true
fi
