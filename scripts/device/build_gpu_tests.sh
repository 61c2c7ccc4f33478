#!/usr/bin/env bash
# Builds the GPU test binaries (release) and the starling binary, and copies them into .device/
# for the device tool to carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .device/tests && mkdir -p .device/tests
cargo build --release -p starling-cli
cp target/release/starling .device/
cargo test --release -p starling-cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
  | while read -r exe; do cp "$exe" .device/tests/; done
# Debug info would push the binaries past the 64 MiB a device call carries.
strip .device/tests/* .device/starling
ls -la .device/tests .device/starling
