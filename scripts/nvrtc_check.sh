#!/usr/bin/env bash
# Compile-checks every CUDA kernel with NVRTC for sm_90 on a machine without a GPU: fetches the
# NVRTC library and the CUDA headers (PyPI wheels, cached under target/nvrtc), then runs the
# ignored test crates/starling-cuda/tests/nvrtc_compile.rs through the backend's own compile path.
#   bash scripts/nvrtc_check.sh
#   NVRTC_ROOT=/path/to/nvidia/cu13 bash scripts/nvrtc_check.sh   # an unpacked copy (lib/, include/)
#   PTXAS=/path/to/ptxas bash scripts/nvrtc_check.sh   # also registers and spills per kernel
#     (ptxas from the nvidia-cuda-nvcc wheel: pip download nvidia-cuda-nvcc==13.0.*)
set -euo pipefail
cd "$(dirname "$0")/.."

root="${NVRTC_ROOT:-target/nvrtc/nvidia/cu13}"
if [ ! -e "$root/lib/libnvrtc.so.13" ] || [ ! -e "$root/include/cuda_bf16.h" ]; then
  if [ -n "${NVRTC_ROOT:-}" ]; then
    echo "NVRTC_ROOT=$NVRTC_ROOT has no lib/libnvrtc.so.13 or include/cuda_bf16.h" >&2
    exit 1
  fi
  echo "== fetching NVRTC and CUDA headers (PyPI wheels) into target/nvrtc"
  rm -rf target/nvrtc/wheels
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest target/nvrtc/wheels \
    "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
  # The three wheels share the nvidia/cu13/{lib,include} tree.
  for wheel in target/nvrtc/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" target/nvrtc
  done
fi
root="$(cd "$root" && pwd)"

# Build first, without the variables below: cudarc's build script reruns whenever CUDA_HOME
# changes, which would rebuild it here and again for every other build sharing target/.
exe=$(cargo test --release -p starling-cuda --test nvrtc_compile --no-run --message-format=json \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
[ -n "$exe" ] || { echo "no nvrtc_compile test binary was built" >&2; exit 1; }

# cudarc's dynamic loader (cuda-13000 feature) tries libnvrtc.so.13 among its names; libnvrtc
# itself loads libnvrtc-builtins.so.13.0 from the same directory through LD_LIBRARY_PATH.
# KernelCache passes $CUDA_HOME/include to NVRTC (cuda_bf16.h and what it includes).
ptx_dir=$(mktemp -d)
trap 'rm -rf "$ptx_dir"' EXIT
LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CUDA_HOME="$root" \
  STARLING_PTX_DIR="$ptx_dir" "$exe" --include-ignored --nocapture
if [ -n "${PTXAS:-}" ]; then
  for ptx in "$ptx_dir"/*.ptx; do
    arch="${ptx%.ptx}"; arch="${arch##*.}"   # <module>.<arch>.ptx
    "$PTXAS" -arch="$arch" -v -o /dev/null "$ptx" 2>&1 \
      | awk '/Compiling entry function/ { name = $(NF - 2) } /Used [0-9]+ registers/ { print name, $0 }
             /bytes stack frame/ && !/0 bytes spill stores, 0 bytes spill loads/ { print name, $0 }'
  done
fi
