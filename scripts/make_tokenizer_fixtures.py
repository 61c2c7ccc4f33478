#!/usr/bin/env python3
"""Write a tokenizer parity fixture for one GGUF model, using Hugging Face transformers as the
reference implementation.

The fixture holds, for a fixed set of tricky strings, the token ids transformers produces and
the decoded text, plus the chat template rendered for two short conversations. The Rust tests
in crates/starling-models/tests/ compare Starling's tokenizer and chat template against it.

Setup (outside the repo, e.g. a venv under /tmp):

    python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install transformers gguf tokenizers torch

torch is listed because transformers' GGUF reader imports it at module level, even when only
the tokenizer is loaded.

Usage (models come from `starling model fetch <alias>`; see the cache under $STARLING_HOME):

    /tmp/tokvenv/bin/python scripts/make_tokenizer_fixtures.py \
        --gguf ~/.cache/starling/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf \
        --alias smollm2-135m \
        --out crates/starling-models/tests/fixtures/tokenizer/smollm2-135m.json
"""

import argparse
import hashlib
import json
import os
import re
import sys

# Each string targets one behaviour of byte-level BPE and its pre-tokenizer regex.
TEXTS = [
    "Hello, world! This is a test.",
    "fn main() {\n    println!(\"hi {}\", 42);\n}\n",
    "def square(x):\n\treturn x ** 2  # comment\n",
    "1234567",
    "The year 2024 had 366 days; pi is 3.14159.",
    "   leading and trailing spaces   ",
    "a  b   c    d\t\te",
    "line one\n\nline three\r\nwindows line\n\n\n",
    "    \n        \n",
    "日本語のテキストと中文文本，还有한국어",
    "Emoji: 😀🎉👍🏽 and ❤️ and 🇫🇷",
    "Ünïcödé àccents — dash … ellipsis «quotes»",
    "don't I'll we've THEY'RE it's",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "",
]

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
]


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="path to the GGUF file")
    parser.add_argument("--alias", required=True, help="Starling model alias, recorded in the fixture")
    parser.add_argument("--out", required=True, help="fixture JSON to write")
    args = parser.parse_args()

    import transformers
    from transformers import AutoTokenizer

    gguf = os.path.abspath(args.gguf)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))

    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )

    chats = []
    # A base model without a chat template (Gemma-3-270M) records no chats.
    for messages in CONVERSATIONS if tok.chat_template else []:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chats.append({"messages": messages, "add_generation_prompt": True, "rendered": rendered})

    fixture = {
        "alias": args.alias,
        "gguf_file": os.path.basename(gguf),
        "gguf_sha256": sha256_of(gguf),
        "generated_by": f"transformers {transformers.__version__}, scripts/make_tokenizer_fixtures.py",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": tok.chat_template,
        "cases": cases,
        "chats": chats,
    }
    text = json.dumps(fixture, ensure_ascii=False, indent=1)
    # Keep each id list on one line so the fixture stays readable and diffs stay small.
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {len(cases)} cases and {len(chats)} chats to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
