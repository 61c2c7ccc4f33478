#!/usr/bin/env bash
# The Hopper prefill kernel (prefill_wgmma.cu, warp-specialised; KERNEL=wgmma, the default) on
# the device, in one call: its prefill parity first (exit 1 if it fails); then the whole parity
# suite, the prefill tests again on the mma.sync kernel, the decode-graph tests where carried
# (GEMMs recorded into graphs, the cuBLASLt bias epilogue's among them), and
# `bench kernels --prompt-prefill` with each prefill kernel of BENCH (default "$KERNEL mma"),
# then with each edit of VARIANTS (sed expressions separated by ";;", applied to copies of the
# checkout's prefill_wgmma.cu and compiled from there, STARLING_KERNEL_DIR: no rebuild), each
# parity-checked and benched: e.g. VARIANTS='s/^#define WS_STAGES .*/#define WS_STAGES 4/'.
# SKIP_SUITE=1 skips the whole parity suite, the mma.sync and graph tests (kernel variants only).
#   carry [".device/starling", ".device/tests/parity-<hash>", ".device/tests/graphs_gpu-<hash>"]
#   command: bash scripts/device/wgmma_check.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
P=$(ls .device/tests/parity-* | head -1)
S=${S:-.device/starling}
# The device tool returns at most 8 files: everything also goes into check.tgz.
trap 'tar czf "$OUT/check.tgz" -C "$OUT" --exclude check.tgz . 2>/dev/null' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; } | tee "$OUT/card.txt"
K=${KERNEL:-wgmma}
export STARLING_PREFILL_KERNEL=$K STARLING_GEMM_BIAS_EPILOGUE=1
if ! timeout 120 "$P" --include-ignored --test-threads=1 prefill_attention_matches_cpu \
  > "$OUT/parity_prefill_$K.log" 2>&1; then
  grep -E "panicked|rel|err" "$OUT/parity_prefill_$K.log" | head -5
  exit 1
fi
tail -3 "$OUT/parity_prefill_$K.log"
status=0
if [ -z "${SKIP_SUITE:-}" ]; then
timeout 240 "$P" --include-ignored --test-threads=1 > "$OUT/parity_default.log" 2>&1 || status=1
grep -E "^test |test result" "$OUT/parity_default.log" | grep -v " ok$" | head -20
STARLING_PREFILL_KERNEL=mma timeout 100 "$P" --include-ignored --test-threads=1 prefill windowed gqa \
  > "$OUT/parity_mma.log" 2>&1 || status=1
grep "test result" "$OUT/parity_mma.log"
for g in .device/tests/graphs_gpu-*; do
  [ -x "$g" ] || continue
  timeout 120 "$g" --include-ignored --test-threads=1 > "$OUT/graphs_gpu.log" 2>&1 || status=1
  grep "test result" "$OUT/graphs_gpu.log"
done
fi
for k in $(echo "${BENCH:-$K mma}" | tr ' ' '\n' | awk '!seen[$0]++'); do
  STARLING_PREFILL_KERNEL=$k timeout 120 "$S" bench kernels --prompt-prefill \
    --output "$OUT/prompt_prefill_$k.json" > "$OUT/prompt_prefill_$k.md" 2>&1 || status=1
  grep -E "kernel|Qwen|GQA" "$OUT/prompt_prefill_$k.md" | head -14
done
i=0
IFS=$'\n'
for v in $(echo "${VARIANTS:-}" | sed 's/;;/\n/g'); do
  i=$((i + 1))
  d=$HOME/kernels_variant_$i
  rm -rf "$d" && cp -r crates/starling-cuda/kernels "$d" && sed -i "$v" "$d/prefill_wgmma.cu"
  echo "== variant $i: $v" | tee "$OUT/variant_$i.txt"
  STARLING_KERNEL_DIR=$d timeout 60 "$P" --include-ignored --test-threads=1 \
    prefill_attention_matches_cpu 2>&1 | grep -E "test result|panicked" | head -3
  STARLING_KERNEL_DIR=$d timeout 120 "$S" bench kernels --prompt-prefill \
    --output "$OUT/prompt_prefill_variant_$i.json" > "$OUT/prompt_prefill_variant_$i.md" 2>&1 ||
    status=1
  grep -E "kernel|Qwen|GQA" "$OUT/prompt_prefill_variant_$i.md" | head -14
done
exit $status
