#!/usr/bin/env python3
"""HF transformers' answers to the exact prompts of a Starling NIAH run.

`starling bench niah --dump-prompts` writes prompts.json: every cell's prompt token ids (chat
template applied), max_new_tokens and the end-of-sequence ids. This script loads the same GGUF
with transformers (dequantised by the `gguf` package), generates greedily from those ids with the
same limits, and writes hf_answers.json; `starling bench niah --compare-hf hf_answers.json` then
lines up Starling's `none` answers with these, cell by cell.

usage: niah_hf.py MODEL_DIR GGUF_NAME PROMPTS_JSON OUT_JSON [--dtype bfloat16|float32] [--device cuda|cpu]
Run where torch + transformers (5.x) + gguf are installed (the GPU machine: see
scripts/device/niah_gpu.sh).
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("gguf_file")
    parser.add_argument("prompts")
    parser.add_argument("output")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    with open(args.prompts) as f:
        dump = json.load(f)
    eos = [int(t) for t in dump["eos_token_ids"]]
    max_new = int(dump["max_new_tokens"])
    dtype = getattr(torch, args.dtype)
    tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=args.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, gguf_file=args.gguf_file, dtype=dtype
    ).to(args.device).eval()

    cells = []
    started = time.time()
    with torch.no_grad():
        for n, cell in enumerate(dump["cells"], 1):
            ids = torch.tensor([cell["prompt_ids"]], device=args.device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                eos_token_id=eos,
                pad_token_id=eos[0] if eos else None,
            )
            generated = out[0, ids.shape[1]:].tolist()
            # Stop before the first end-of-sequence id; the comparison drops Starling's too.
            for i, token in enumerate(generated):
                if token in eos:
                    generated = generated[:i]
                    break
            answer = tok.decode(generated, skip_special_tokens=True)
            cells.append(
                {
                    "context_tokens": cell["context_tokens"],
                    "depth_percent": cell["depth_percent"],
                    "prompt_tokens": ids.shape[1],
                    "output_ids": generated,
                    "answer": answer,
                }
            )
            print(
                f"[{n}/{len(dump['cells'])}] {cell['context_tokens']} tokens, depth "
                f"{cell['depth_percent']}%: {answer[:80]!r} ({time.time() - started:.0f} s)"
            )

    doc = {
        "generator": {
            "script": "scripts/niah_hf.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dtype": args.dtype,
            "device": args.device,
            "gguf_file": args.gguf_file,
            "max_new_tokens": max_new,
            "model": dump.get("model"),
        },
        "cells": cells,
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{len(cells)} answers written to {args.output}")


if __name__ == "__main__":
    main()
