#!/usr/bin/env bash
# A Hopper prefill kernel (prefill_wgmma.cu; KERNEL=wgmma, the default, or wgmma-ws, the
# warp-specialised one) on the device, in one call: its prefill parity first; if that fails,
# for wgmma the same test over the four (Q/K, V) descriptor-offset arrangements,
# compiled from edited copies of the checkout's kernels (STARLING_KERNEL_DIR: no rebuild), to
# tell a layout mistake from another; if it passes, the whole parity suite, the prefill tests
# again on the mma.sync kernel, the decode-graph tests where carried (GEMMs recorded into
# graphs, the cuBLASLt bias epilogue's among them), and `bench kernels --prompt-prefill` with
# each prefill kernel (the one under test, wgmma, mma), then with each edit of VARIANTS (sed
# expressions separated by ";;", applied to copies of prefill_wgmma.cu: e.g.
# VARIANTS='s/^#define WS_LAG .*/#define WS_LAG 1/').
# BENCH lists the kernels benched as built (default "$KERNEL wgmma mma"); SKIP_SUITE=1 skips the whole parity suite, the mma.sync and graph tests (kernel variants only).
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
# The kernel under test is opt-in until measured: ask for it.
export STARLING_PREFILL_KERNEL=$K STARLING_GEMM_BIAS_EPILOGUE=1
if ! timeout 120 "$P" --include-ignored --test-threads=1 prefill_attention_matches_cpu \
  > "$OUT/parity_prefill_$K.log" 2>&1; then
  grep -E "panicked|rel|err" "$OUT/parity_prefill_$K.log" | head -5
  if [ "$K" != wgmma ]; then
    # Do the parts it shares with the wgmma kernel (descriptors, softmax) pass there?
    STARLING_PREFILL_KERNEL=wgmma timeout 60 "$P" --include-ignored --test-threads=1 \
      prefill_attention_matches_cpu 2>&1 | grep -E "test result|panicked" | head -3
    exit 1
  fi
  for v in "2048 128 2048 128" "128 2048 128 2048" "2048 128 128 2048"; do
    set -- $v
    d=$HOME/kernels_$1_$2_$3_$4
    rm -rf "$d" && cp -r crates/starling-cuda/kernels "$d"
    sed -i "s/^#define WG_QK_LBO .*/#define WG_QK_LBO $1/; s/^#define WG_QK_SBO .*/#define WG_QK_SBO $2/;
            s/^#define WG_V_LBO .*/#define WG_V_LBO $3/; s/^#define WG_V_SBO .*/#define WG_V_SBO $4/" \
      "$d/prefill_wgmma.cu"
    echo "== Q/K lbo $1 sbo $2, V lbo $3 sbo $4"
    STARLING_KERNEL_DIR=$d timeout 60 "$P" --include-ignored --test-threads=1 \
      prefill_attention_matches_cpu 2>&1 | grep -E "test result|panicked|rel|err" | head -4
  done
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
for k in $(echo "${BENCH:-$K wgmma mma}" | tr ' ' '\n' | awk '!seen[$0]++'); do
  STARLING_PREFILL_KERNEL=$k timeout 120 "$S" bench kernels --prompt-prefill \
    --output "$OUT/prompt_prefill_$k.json" > "$OUT/prompt_prefill_$k.md" 2>&1 || status=1
  grep -E "kernel|Qwen|GQA" "$OUT/prompt_prefill_$k.md" | head -10
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
  grep -E "kernel|Qwen|GQA" "$OUT/prompt_prefill_variant_$i.md" | head -10
done
exit $status
