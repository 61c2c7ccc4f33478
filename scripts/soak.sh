#!/usr/bin/env bash
# The issue-23 soak (crates/starling-server/tests/soak.rs, #[ignore]d in the normal run):
# 1,000 requests against SmolLM2 on the CPU at ~4x KV capacity, on loopback, with random
# disconnects, slow clients, bad requests and a mix of eviction methods. Records its summary in
# bench/results/soak.txt. Needs the cached SmolLM2 (`starling model fetch smollm2-135m`).
set -euo pipefail
cd "$(dirname "$0")/.."
report="${1:-bench/results/soak.txt}"
mkdir -p "$(dirname "$report")"
STARLING_SOAK_REPORT="$(pwd)/$report" cargo test --release -p starling-server --test soak -- \
  --ignored --nocapture
echo "summary written to $report"
