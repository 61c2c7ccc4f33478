#!/usr/bin/env bash
# Builds what scripts/device/evict_scale.sh and niah_kvpress.sh carry, into .device/ (stripped:
# about 21 MiB per starling binary, 10 MiB for the parity tests):
#   .device/starling          this tree
#   .device/starling-before   the issue's base commit (BEFORE, default 4c3c87a), for the "before"
#                             stall arms; built from `git archive` in a temporary folder
#   .device/tests/parity-*    starling-cuda's GPU parity tests
#   .device/wheels/           gguf (transformers reads the GGUF) and kvpress, pure Python
#   .device/essays/           the Paul Graham essays (the device has no network)
# One device call carries 64 MiB with the tracked tree: if everything does not fit, stage
# .device/starling-before to $HOME/stage on the machine first (../shared/tools/stage-chunks) and
# set BEFORE_BIN there, or skip the before arms (ARMS=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${BEFORE:-4c3c87a}
mkdir -p .device/tests .device/wheels
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$before" | tar -x -C "$tmp"
target=${CARGO_TARGET_DIR:-target}
# Its own target folder: cargo hashes workspace members without their path, so two checkouts
# sharing one folder overwrite each other's crates. Seeded from ours, it rebuilds only those.
before_target=${BEFORE_TARGET_DIR:-$target-before}
[ -d "$before_target" ] || { [ -d "$target" ] && cp -a "$target" "$before_target"; } || true
CARGO_TARGET_DIR=$before_target cargo build --release -p starling-cli --manifest-path "$tmp/Cargo.toml"
cp "$before_target/release/starling" .device/starling-before
cargo build --release -p starling-cli
cp "$target/release/starling" .device/starling
rm -f .device/tests/parity-*
cargo test --release -p starling-cuda --test parity --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
  | while read -r exe; do cp "$exe" .device/tests/; done
strip .device/starling .device/starling-before .device/tests/parity-*
# Pure-Python wheels the machine lacks (torch 2.11, transformers 5.17 are there). kvpress pins
# transformers < 5.3; it is installed without its dependencies and scripts/niah_kvpress.py
# imports only its press modules when the package itself does not import.
python3 -m pip download -q --no-deps gguf==0.19.0 kvpress==0.5.5 -d .device/wheels
essays=${STARLING_HOME:-$HOME/.cache/starling}/datasets/paul-graham-essays
if [ -d "$essays" ]; then rm -rf .device/essays && cp -r "$essays" .device/essays; fi
du -sh .device/starling .device/starling-before .device/tests .device/wheels .device/essays 2>/dev/null
