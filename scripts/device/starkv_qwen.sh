#!/usr/bin/env bash
# STAR-KV on Qwen2.5-Coder-1.5B on the device, after staging the GGUF pieces (q.NN, see
# NOTES.md) to $HOME/stage and carrying .device/starling and .device/essays. One step per call so
# each stays under the 10-minute command limit; checkpoints stay in $HOME between calls of a lease.
#   starkv_qwen.sh assemble                 join + verify the pieces
#   starkv_qwen.sh calibrate NAME PROFILES [calibrate flags…]   → $HOME/ckpt_NAME
#   starkv_qwen.sh eval NAME PROFILE FACTORS [niah]   quality (+ NIAH) of one checkpoint → $OUT
#   starkv_qwen.sh baseline [niah]          the same benches without compression
# NIAH_DEPTHS (default 0,25,50,75,100) sets the needle depths: 11 or more resolve a few points.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
gguf=$HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
step=$1
shift
case "$step" in
assemble)
  cat "$HOME"/stage/q.* > "$gguf" && rm -f "$HOME"/stage/q.*
  echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c -
  ;;
calibrate)
  name=$1 profiles=$2
  shift 2
  date -u +%FT%TZ
  .device/starling calibrate --device cuda --model "$gguf" --profiles "$profiles" \
    --essays-dir .device/essays --output "$HOME/ckpt_$name" "$@" 2>&1 | grep -v "^\s*$" | tail -12 \
    | tee "$OUT/calibrate_$name.log"
  cp "$HOME/ckpt_$name"/*/manifest.json "$OUT/" 2>/dev/null || true
  ;;
eval | baseline)
  if [ "$step" = eval ]; then
    name=$1 profile=$2 factors=$3 niah=${4:-}
    kv="{\"method\":\"star_kv\",\"checkpoint\":\"$HOME/ckpt_$name\",\"rank_profile\":\"$profile\",\"factors\":\"$factors\"}"
    compression=(--kv-compression "$kv")
    tag=${name}_${profile}_${factors}
  else
    niah=${1:-}
    compression=()
    tag=uncompressed
  fi
  .device/starling bench quality --device cuda --model "$gguf" --methods none --context-tokens 4096 \
    --eval-tokens 256 --num-windows 6 --essays-dir .device/essays "${compression[@]}" \
    --output "$OUT/q_$tag" 2>&1 | grep -E "^\| none \||perplexity" | tail -3
  if [ -n "$niah" ]; then
    timeout 280 .device/starling bench niah --device cuda --model "$gguf" --contexts 1k,4k,8k,16k,30k \
      --depths "${NIAH_DEPTHS:-0,25,50,75,100}" --methods none --essays-dir .device/essays \
      "${compression[@]}" --output "$OUT/niah_$tag" 2>&1 | grep -A4 "facts found" | tail -3
  fi
  ;;
*)
  echo "unknown step $step" >&2
  exit 2
  ;;
esac
