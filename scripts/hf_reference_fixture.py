#!/usr/bin/env python3
"""Reference fixture from HF transformers for Starling's model-parity tests.

Loads a GGUF with transformers (which dequantises it with the `gguf` package, code nobody in this
project wrote), greedily continues fixed prompts, and records for every position of prompt +
continuation the top-5 next-token logits, computed in float32 on the CPU (no TF32, no bf16).

usage: hf_reference_fixture.py MODEL_DIR GGUF_NAME OUT_JSON [MAX_NEW_TOKENS]
Run where torch + transformers + gguf are installed (the GPU machine: see ../shared/DEVICE.md and
scripts/device/hf_fixture.sh).
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village,",
]


def main() -> None:
    model_dir, gguf_name, out_path = sys.argv[1:4]
    max_new = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=gguf_name, torch_dtype=torch.float32
    ).eval()
    cases = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(
                ids, max_new_tokens=max_new, do_sample=False, attention_mask=torch.ones_like(ids)
            )
            full = out[0]
            logits = model(full.unsqueeze(0)).logits[0].float()
            top = torch.topk(logits, 5, dim=-1)
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_ids": ids[0].tolist(),
                    "greedy_ids": full[ids.shape[1]:].tolist(),
                    "top5_ids": top.indices.tolist(),
                    "top5_logits": [[round(v, 5) for v in row] for row in top.values.tolist()],
                }
            )
    fixture = {
        "generator": "scripts/hf_reference_fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32 (cpu)",
        "gguf_file": gguf_name,
        "max_new_tokens": max_new,
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, indent=1)
    for c in cases:
        print(repr(c["prompt"]), "->", repr(tok.decode(c["greedy_ids"])))


if __name__ == "__main__":
    main()
