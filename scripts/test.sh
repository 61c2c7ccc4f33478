#!/usr/bin/env bash
# The README's test command: the whole workspace's tests on the CPU. Tests that need the GPU are
# #[ignore]d here (listed as ignored in the output) and run through scripts/device/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --release "$@"
# The HTTP server through the official OpenAI Python client.
bash scripts/test_server.sh
