#!/usr/bin/env bash
# Runs HERE, in the checkout the device tool sends: prepares .device/ for
# scripts/device/vllm_campaign.sh and prints the device calls to make, back to back.
#   .device/vllm/            the vLLM 0.26.0 wheel set (80 wheels, 343 MB; ../shared/tools/vllm/download.sh)
#   .device/vparts/          the vllm wheel in pieces that fit one call beside the tree, + SHA256SUMS
#   .device/vdeps/{a,b}/     the other 79 wheels, in two halves (one call each)
#   .device/qwen_tokenizer/  the Qwen2 tokenizer (scripts/device/make_tokenizer_qwen.sh), and
#   .device/qtok.tgz         the same folder archived: what the last call carries (2 MB for 11)
#   .device/sharegpt.json    800 chitchat conversations in ShareGPT form (the scheduler campaign)
#   .device/starling         checked only: cargo build --release -p starling-cli, then strip it there
# usage: bash scripts/device/stage_vllm.sh   (VLLM_TOOLS: where download.sh is, default ../shared/tools/vllm)
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM_TOOLS=${VLLM_TOOLS:-../shared/tools/vllm}
WHEEL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL_SHA=adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de
LIMIT_BYTES=$((64 << 20))

if [ ! -s ".device/vllm/$WHEEL" ]; then
  bash "$VLLM_TOOLS/download.sh" .device/vllm
fi
echo "$WHEEL_SHA  .device/vllm/$WHEEL" | sha256sum -c --quiet -

# What travels with every call besides the carried paths: tracked and untracked-not-ignored files.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
# 10 MB of margin: pieces that left 3 MB were refused as "over 64 MiB" (session 21: 47 MB
# beside a 19 MB tree refused, 38 MB carried).
piece=$((LIMIT_BYTES - tree_bytes - 10000000))
[ "$piece" -gt 55000000 ] && piece=55000000
[ "$piece" -gt 20000000 ] || { echo "the tree ($tree_bytes bytes) leaves no room for wheel pieces"; exit 1; }
rm -rf .device/vparts .device/vdeps
mkdir -p .device/vparts .device/vdeps
split -b "$piece" -d -a 2 ".device/vllm/$WHEEL" .device/vparts/vllm.part
echo "$WHEEL_SHA  $WHEEL" > .device/vparts/SHA256SUMS
(cd .device/vparts && sha256sum vllm.part*) >> .device/vparts/SHA256SUMS
# The other wheels in two folders of about equal size (together they are over a call's room
# beside the tree): largest first, each into the lighter folder.
mkdir -p .device/vdeps/a .device/vdeps/b
bytes_a=0; bytes_b=0
while read -r size w; do
  [ "${w##*/}" = "$WHEEL" ] && continue
  if [ "$bytes_a" -le "$bytes_b" ]; then bin=a; bytes_a=$((bytes_a + size)); else bin=b; bytes_b=$((bytes_b + size)); fi
  ln -f "$w" ".device/vdeps/$bin/" 2>/dev/null || cp "$w" ".device/vdeps/$bin/"
done < <(find .device/vllm -maxdepth 1 -name '*.whl' -printf '%s %p\n' | sort -rn)
for bytes in "$bytes_a" "$bytes_b"; do
  [ $((bytes + tree_bytes)) -lt "$LIMIT_BYTES" ] || { echo "a dependency folder ($bytes bytes) does not fit one call"; exit 1; }
done

[ -s .device/qwen_tokenizer/tokenizer.json ] || bash scripts/device/make_tokenizer_qwen.sh
tar czf .device/qtok.tgz -C .device qwen_tokenizer

if [ ! -s .device/sharegpt.json ]; then
  full=${STARLING_HOME:-$HOME/.cache/starling}/datasets/chitchat_sharegpt.json
  [ -s "$full" ] || python3 scripts/chitchat_to_sharegpt.py --output "$full"
  python3 - "$full" .device/sharegpt.json <<'PY'
import json, sys
conversations = json.load(open(sys.argv[1]))
json.dump(conversations[:800], open(sys.argv[2], "w"))
print(f"{min(800, len(conversations))} of {len(conversations)} conversations kept")
PY
fi

[ -x .device/starling ] || echo "NOTE: .device/starling is missing: cargo build --release -p starling-cli && cp target/release/starling .device/ && strip .device/starling"
main_bytes=$({ cat .device/starling .device/qtok.tgz .device/sharegpt.json .device/vparts/SHA256SUMS 2>/dev/null || true; } | wc -c)
[ $((main_bytes + tree_bytes)) -lt "$LIMIT_BYTES" ] || echo "WARNING: the last call carries $((main_bytes + tree_bytes)) bytes, over 64 MiB"

n=$(find .device/vparts -name 'vllm.part*' | wc -l)
echo
echo "Device calls, back to back (tree $tree_bytes bytes; pieces of $piece bytes):"
i=1
for p in .device/vparts/vllm.part*; do
  echo "  $i. carry [\"$p\"]  command: mkdir -p \$HOME/vw && cp $p \$HOME/vw/ && ls -l \$HOME/vw"
  i=$((i + 1))
done
for half in a b; do
  echo "  $i. carry [\".device/vdeps/$half\"]  command: mkdir -p \$HOME/vw && cp .device/vdeps/$half/*.whl \$HOME/vw/ && ls \$HOME/vw | wc -l"
  i=$((i + 1))
done
echo "  $i. carry [\".device/starling\", \".device/qtok.tgz\", \".device/sharegpt.json\", \".device/vparts/SHA256SUMS\"]  command: bash scripts/device/vllm_campaign.sh   (timeout_s 600)"
echo "($n pieces + 2 dependency calls; expected device time: ~15 s per staging call, 7-9.5 min for the last)"
