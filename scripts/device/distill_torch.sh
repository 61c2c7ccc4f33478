#!/usr/bin/env bash
# STAR-KV distillation at scale on the device (issue 16): `starling calibrate --distill-backend
# torch` on Qwen2.5-Coder-1.5B, then held-out perplexity (and NIAH) of each checkpoint beside the
# uncompressed model. One step per call (each under the 10-minute command limit); checkpoints stay
# in $HOME between calls of a lease.
# Carried: .device/starling (stripped release build), .device/essays/paul-graham-essays,
# .device/wheels/gguf-0.19.0-py3-none-any.whl (transformers reads GGUF with it; the device has
# torch, transformers and accelerate), .device/chitchat_sharegpt.json.gz (the cached chitchat
# conversion), .device/shakespeare.txt.gz for `--distill-text essays-and-prose` /
# `essays-prose-and-chat` (here: gzip -c ~/.cache/starling/datasets/shakespeare/shakespeare.txt,
# after any `starling calibrate` with those texts or the hub's fetch_prose has cached it; 1.9 MB).
# The GGUF is staged as $HOME/stage/q.* pieces and joined by `assemble`.
#   distill_torch.sh setup                  wheels, the conversation file, version check
#   distill_torch.sh assemble               join + verify the pieces
#   distill_torch.sh calibrate NAME PROFILES [calibrate flags…]   torch backend → $HOME/ckpt_NAME
#   distill_torch.sh svd NAME PROFILES      whitened SVD only (the ablation's first row)
#   distill_torch.sh eval TAG DIR PROFILE [niah|-] [bench flags…]   quality (+ NIAH) of one
#                                           checkpoint → results/; the flags go to both benches
#                                           (e.g. --kv-cache-dtype fp8, --protocol is NIAH-only:
#                                           NIAH_FLAGS); METHODS (default none) adds eviction on
#                                           top, e.g. METHODS=none,keydiff@0.5
#   distill_torch.sh baseline [niah]        the same benches without compression
#   distill_torch.sh pack                   manifests and trainer records → results/records.tgz
#   distill_torch.sh bring DIR PROFILE      one checkpoint back to this machine: $OUT/ckpt.tgz.NN,
#                                           15 MiB pieces (join: cat ckpt.tgz.* | tar xz)
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 PYTHONPATH=$HOME/site
# The tree's trainer (it travels with every call), so a fix to it needs no rebuild of the binary.
export STARLING_TORCH_TRAINER=${STARLING_TORCH_TRAINER:-scripts/starkv_distill_torch.py}
gguf=$HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# Results gather in $RES across the calls of a lease; every call returns all of them so far as
# $OUT/results.tgz (the device tool returns at most 8 files, and a later call may fail).
RES=$HOME/results
mkdir -p "$RES"
trap 'tar czf "$OUT/results.tgz" -C "$HOME" results 2>/dev/null' EXIT
step=$1
shift
quality() { # TAG [--kv-compression JSON]
  local tag=$1
  shift
  .device/starling bench quality --device cuda --model "$gguf" --methods "${METHODS:-none}" --context-tokens 4096 \
    --eval-tokens 256 --num-windows 6 --essays-dir .device/essays/paul-graham-essays "$@" \
    --output "$RES/q_$tag" 2>&1 | grep -E "^\| (none|star_kv|keydiff|snapkv)|perplexity" | tail -6
}
niah() { # TAG [--kv-compression JSON]
  local tag=$1
  shift
  timeout 280 .device/starling bench niah --device cuda --model "$gguf" --contexts 1k,4k,8k,16k,30k \
    --depths "${NIAH_DEPTHS:-0,10,20,30,40,50,60,70,80,90,100}" --methods "${METHODS:-none}" \
    --essays-dir .device/essays/paul-graham-essays ${NIAH_FLAGS:-} "$@" --output "$RES/niah_$tag" 2>&1 \
    | grep -A6 "facts found" | tail -5
}
case "$step" in
setup)
  python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .device/wheels/gguf-*.whl
  mkdir -p "$HOME/.cache/starling/datasets"
  gunzip -c .device/chitchat_sharegpt.json.gz > "$HOME/.cache/starling/datasets/chitchat_sharegpt.json"
  # The machine has no network: the prose goes where fetch_prose finds (and verifies) it.
  if [ -e .device/shakespeare.txt.gz ]; then
    mkdir -p "$HOME/.cache/starling/datasets/shakespeare"
    gunzip -c .device/shakespeare.txt.gz > "$HOME/.cache/starling/datasets/shakespeare/shakespeare.txt"
  fi
  python3 -c 'import torch, transformers, gguf, accelerate; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())'
  ;;
assemble)
  cat "$HOME"/stage/q.* > "$gguf" && rm -f "$HOME"/stage/q.*
  echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c -
  ;;
calibrate | svd)
  name=$1 profiles=$2
  shift 2
  if [ "$step" = calibrate ]; then backend=(--distill-backend torch); else backend=(--distill-steps 0); fi
  date -u +%FT%TZ
  .device/starling calibrate --device cuda --model "$gguf" --profiles "$profiles" \
    --essays-dir .device/essays/paul-graham-essays --output "$HOME/ckpt_$name" "${backend[@]}" "$@" 2>&1 \
    | grep -v -E "GGUF tensors|Loading weights|^\s*$" | tail -15 | tee -a "$RES/calibrate_$name.log"
  date -u +%FT%TZ
  ;;
eval)
  tag=$1 dir=$2 profile=$3 with_niah=${4:-}
  shift 3
  [ $# -gt 0 ] && shift
  kv="{\"method\":\"star_kv\",\"checkpoint\":\"$dir\",\"rank_profile\":\"$profile\"}"
  quality "$tag" --kv-compression "$kv" "$@"
  if [ "$with_niah" = niah ]; then niah "$tag" --kv-compression "$kv" "$@"; fi
  ;;
baseline)
  quality uncompressed
  [ -n "${1:-}" ] && niah uncompressed
  ;;
pack)
  (cd "$HOME" && find ckpt_* -name manifest.json -o -name thresholds.json -o -name refine.json \
    -o -name job.json | tar czf "$RES/records.tgz" -T -)
  ;;
bring)
  dir=$1 profile=$2
  tar czf - -C "$dir" "$profile" | split -b 15728640 -d -a 2 - "$OUT/ckpt.tgz."
  ls -l "$OUT"/ckpt.tgz.*
  ;;
*)
  echo "unknown step $step" >&2
  exit 2
  ;;
esac
