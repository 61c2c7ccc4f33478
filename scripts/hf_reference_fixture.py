#!/usr/bin/env python3
"""Reference fixture from HF transformers for Starling's model-parity tests.

Loads a GGUF with transformers (which dequantises it with the `gguf` package, code nobody in this
project wrote), greedily continues fixed prompts, and records for every position of prompt +
continuation the top-5 next-token logits, computed in float32 on the CPU (no TF32, no bf16).

usage: hf_reference_fixture.py MODEL_DIR GGUF_NAME OUT_JSON [MAX_NEW_TOKENS] [--long-prompt]
       [--bf16-spread]
  --bf16-spread: also run the model in bfloat16 and record, per case, how far its top-5 logits
    sit from the float32 ones (mean and max |dlogit|): the noise a bf16 engine is judged against.
  --long-prompt: one more case, a prompt of about 1,500 tokens whose answer sits near its start,
    beyond a 512-token sliding window (Gemma-3): the full layers must carry it.
Run where torch + transformers + gguf are installed (the GPU machine: see ../shared/DEVICE.md and
scripts/device/hf_fixture.sh).
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

# A long prompt: eighty numbered facts, then the question about an early one.
LONG_PROMPT = (
    " ".join(f"Fact {i}: the secret word of room {i} is {w}." for i, w in enumerate(
        ["apple", "river", "candle", "mountain", "violet", "harbor", "lantern", "meadow"] * 10
    ))
    + " Question: what is the secret word of room 3? Answer: the secret word of room 3 is"
)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village,",
]


def add_bf16_spread(model_dir: str, gguf_name: str, cases: list) -> None:
    """Per case, the bf16 model's mean and max |dlogit| on the recorded top-5 logits."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=gguf_name, dtype=torch.bfloat16
    ).eval()
    with torch.no_grad():
        for case in cases:
            ids = torch.tensor([case["prompt_ids"] + case["greedy_ids"]])
            logits = model(ids).logits[0].float()
            diffs = [
                abs(logits[p, i].item() - want)
                for p, (top_ids, top_logits) in enumerate(zip(case["top5_ids"], case["top5_logits"]))
                for i, want in zip(top_ids, top_logits)
            ]
            case["bf16_mean_abs"] = round(sum(diffs) / len(diffs), 5)
            case["bf16_max_abs"] = round(max(diffs), 5)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    model_dir, gguf_name, out_path = args[:3]
    max_new = int(args[3]) if len(args) > 3 else 16
    prompts = PROMPTS + ([LONG_PROMPT] if "--long-prompt" in sys.argv else [])
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=gguf_name, torch_dtype=torch.float32
    ).eval()
    cases = []
    with torch.no_grad():
        for prompt in prompts:
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
    if "--bf16-spread" in sys.argv:
        add_bf16_spread(model_dir, gguf_name, cases)
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
        print(repr(c["prompt"][-60:]), len(c["prompt_ids"]), "->", repr(tok.decode(c["greedy_ids"])))


if __name__ == "__main__":
    main()
