#!/usr/bin/env bash
# The OpenAI-client tests of `starling serve` (tests/server/, pytest): builds the release binary,
# makes a venv under target/ with the official `openai` package and pytest (once), runs them.
# Needs the cached SmolLM2 model (`starling model fetch smollm2-135m`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/pyenv-server
if ! "$VENV/bin/python" -c "import openai, pytest" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "openai>=1.40,<2" "pytest>=8,<9"
fi
cargo build --release -q -p starling-cli
"$VENV/bin/python" -m pytest -q tests/server "$@"
