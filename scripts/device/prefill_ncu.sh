#!/usr/bin/env bash
# Nsight Compute's full metric set for one whole-prompt prefill launch (the first shape of
# `bench kernels --prompt-prefill`, MHA 32x128 at 4k, past its warm-up launches) of each Hopper
# candidate and of the mma.sync kernel, in one call: where each one's time goes (tensor pipe,
# L2 and shared-memory throughput, warp stalls). KERNEL_DIR (default: the tree's kernels, so
# the kernel files' defaults rather than the binary's built-in text) feeds the wgmma kernel.
#   carry [".device/starling"]   command: bash scripts/device/prefill_ncu.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -x "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; } | tee "$OUT/card.txt"
dir=${KERNEL_DIR:-crates/starling-cuda/kernels}
# SED: an edit of prefill_wgmma.cu (e.g. a variant's define) applied to a copy of that directory.
if [ -n "${SED:-}" ]; then
  rm -rf "$HOME/ncu_kernels" && cp -r "$dir" "$HOME/ncu_kernels" && sed -i "$SED" "$HOME/ncu_kernels/prefill_wgmma.cu"
  dir=$HOME/ncu_kernels
fi
for k in ${KERNELS:-wgmma mma}; do
  STARLING_PREFILL_KERNEL=$k STARLING_KERNEL_DIR=$dir timeout 150 "$ncu" --set full \
    --kernel-name regex:'prefill_(wgmma_ws|attention)_d128_bf16' --launch-skip 5 --launch-count 1 \
    .device/starling bench kernels --prompt-prefill > "$OUT/ncu_$k.txt" 2>&1 || echo "ncu $k: exit $?"
  echo "== $k"
  grep -E "^  [a-z_]+_d128_bf16|Duration|Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|L2 Hit|Bank Conflicts" \
    "$OUT/ncu_$k.txt" | head -30
done
