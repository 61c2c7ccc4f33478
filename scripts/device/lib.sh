# Helpers the device scripts source (`. "$(dirname "$0")/lib.sh"`); nothing here runs by itself.

# wait_healthy PORT [PID] [SECONDS]: waits until the server on 127.0.0.1:PORT answers /health
# (0), or until SECONDS (default 120) have passed or process PID has exited (1).
wait_healthy() {
  local port=$1 pid=${2:-} seconds=${3:-120}
  for _ in $(seq 1 "$seconds"); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      2>/dev/null && return 0
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 1
  done
  return 1
}

# qwen_tokenizer: makes .device/qwen_tokenizer from .device/qtok.tgz where only the archive was
# carried (the folder is 11 MB, the archive 2 MB: with the tree and the binary, the folder
# pushed a call over its 64 MiB; scripts/device/stage_vllm.sh makes both).
qwen_tokenizer() {
  [ -s .device/qwen_tokenizer/tokenizer.json ] && return 0
  [ -s .device/qtok.tgz ] || { echo "neither .device/qwen_tokenizer nor .device/qtok.tgz" >&2; return 1; }
  tar xzf .device/qtok.tgz -C .device
}

# kernel_variant DIR FILES "DEFINE=value,...": a copy of the kernel sources in DIR with those
# `#define`s rewritten, each in the first of FILES (a comma list, in crates/starling-cuda/kernels)
# that defines it, for STARLING_KERNEL_DIR (A/B runs of compile-time knobs without a rebuild).
# Fails (1) where none of FILES has one of the defines.
kernel_variant() {
  local dir=$1 files defs d key f found
  cp -r crates/starling-cuda/kernels "$dir" || return 1
  IFS=, read -ra files <<< "$2"
  IFS=, read -ra defs <<< "$3"
  for d in "${defs[@]}"; do
    key=${d%%=*}
    found=
    for f in "${files[@]}"; do
      if grep -q "^#define $key " "$dir/$f"; then found=$f; break; fi
    done
    [ -n "$found" ] || { echo "no #define $key in $2" >&2; return 1; }
    sed -i "s|^#define $key .*|#define $key ${d#*=}|" "$dir/$found"
  done
}
