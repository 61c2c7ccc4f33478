#!/usr/bin/env python3
"""A tiny random model from HF transformers' own architecture code, and its reference logits.

Builds `Qwen3ForCausalLM` (default), `MistralForCausalLM` (`--arch mistral`) or
`Gemma3ForCausalLM` (`--arch gemma3`, the text model) from a small
config with a fixed seed (real architecture code, random weights), saves it as an HF directory
(config.json + model.safetensors, float32), and records the float32 CPU logits at every position
of a few fixed token-id prompts plus their greedy continuations. Starling's CPU tests
(crates/starling-models/tests/hf_fixtures.rs) load the directories and compare;
scripts/device/qwen3_hf_check.sh does the same on the GPU for Qwen3. The committed fixtures:
tests/fixtures/qwen3_tiny (this script when it was make_qwen3_fixture.py) and
tests/fixtures/mistral_tiny (`--arch mistral`) and tests/fixtures/gemma3_tiny (`--arch gemma3`).

Weights are drawn wider than transformers' default (std 0.02 gives near-uniform logits whose
top-1 is decided by rounding), and every RMSNorm weight, q_norm and k_norm included, is drawn
around 1 rather than left at ones, so a norm applied to the wrong head or skipped shows up.

usage: make_hf_fixture.py OUT_DIR [--arch qwen3|mistral|gemma3] [--check] [--head-dim N]
  --check: reload OUT_DIR and verify the stored logits reproduce (no files written).
  --head-dim N: heads of N (default 16, the committed CPU fixture; the CUDA attention kernels
    take 64, 128 and 256, so scripts/device/qwen3_hf_check.sh makes a 128-wide one).
Needs torch, transformers and safetensors (CPU wheels from PyPI are enough).
"""
import json
import sys

import torch
import transformers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SEED = 20261202
# Token-id prompts (no tokenizer: the vocabulary is 256 ids). Lengths 1, 7 and 19, so the test
# covers a single-token prefill and prompts crossing Starling's 16-slot blocks.
PROMPTS = [
    [17],
    [1, 200, 33, 47, 91, 5, 250],
    [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 8],
]
MAX_NEW_TOKENS = 6

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    attention_bias=False,
    use_sliding_window=False,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.1,
    torch_dtype="float32",
)


# Mistral: the Llama layout behind a sliding window of 5 tokens, shorter than two of the three
# prompts and their continuations, so the window decides what is attended.
MISTRAL_CONFIG = {
    **{k: v for k, v in CONFIG.items() if k not in ("use_sliding_window", "attention_bias")},
    "sliding_window": 5,
    "tie_word_embeddings": False,
}
# Gemma-3 (text): three layers, two windowed (5 tokens, local RoPE base 1e4) and one full (base
# 1e6), as Gemma-3's 5-of-6 pattern; one KV head as Gemma-3-270M; a query pre-attention scalar
# that is not the head width, so the attention scale is checked; tied embeddings scaled by
# sqrt(hidden); GeGLU; four norms a layer, stored as offsets from one.
GEMMA3_CONFIG = {
    **{
        k: v
        for k, v in CONFIG.items()
        if k not in ("use_sliding_window", "rope_theta", "num_hidden_layers", "num_key_value_heads")
    },
    "num_hidden_layers": 3,
    "num_key_value_heads": 1,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": 5,
    "query_pre_attn_scalar": 24,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
    "hidden_activation": "gelu_pytorch_tanh",
    "pad_token_id": 0,
}
ARCHES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, CONFIG),
    "mistral": (MistralConfig, MistralForCausalLM, MISTRAL_CONFIG),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, GEMMA3_CONFIG),
}


def build(arch: str, head_dim: int):
    config_class, model_class, config = ARCHES[arch]
    torch.manual_seed(SEED)
    model = model_class(config_class(**{**config, "head_dim": head_dim})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma-3 scales by (1 + weight): its weights are drawn around 0.
                offset = 0.0 if arch == "gemma3" else 1.0
                p.copy_(offset + 0.2 * torch.randn_like(p))
            elif arch == "gemma3" and name.endswith("embed_tokens.weight"):
                # Scaled by sqrt(hidden) = 8 on the way in, embeddings as wide as the others'
                # would drown the layers, and the tied head would echo the input token.
                p.copy_(0.015 * torch.randn_like(p))
    return model


def reference(model) -> list:
    cases = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=0,
                eos_token_id=None,
            )
            full = out[0]
            logits = model(full.unsqueeze(0)).logits[0].float()
            cases.append(
                {
                    "prompt_ids": prompt,
                    "greedy_ids": full[len(prompt):].tolist(),
                    "logits": [[float(f"{v:.6g}") for v in row] for row in logits.tolist()],
                }
            )
    return cases


def main() -> None:
    out_dir = sys.argv[1]
    args = sys.argv[2:]
    arch = args[args.index("--arch") + 1] if "--arch" in args else "qwen3"
    torch.set_default_dtype(torch.float32)
    if "--check" in args:
        model_class = ARCHES[arch][1]
        model = model_class.from_pretrained(out_dir, torch_dtype=torch.float32).eval()
        with open(f"{out_dir}/reference.json") as f:
            stored = json.load(f)["cases"]
        for case, again in zip(stored, reference(model)):
            delta = max(
                abs(a - b)
                for ra, rb in zip(case["logits"], again["logits"])
                for a, b in zip(ra, rb)
            )
            assert case["greedy_ids"] == again["greedy_ids"], "greedy tokens differ"
            print("max |dlogit| after reload:", delta)
        return
    head_dim = int(args[args.index("--head-dim") + 1]) if "--head-dim" in args else 16
    model = build(arch, head_dim)
    model.save_pretrained(out_dir, safe_serialization=True)
    fixture = {
        "generator": f"scripts/make_hf_fixture.py --arch {arch}",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32 (cpu)",
        "seed": SEED,
        "max_new_tokens": MAX_NEW_TOKENS,
        "cases": reference(model),
    }
    with open(f"{out_dir}/reference.json", "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    for case in fixture["cases"]:
        print(case["prompt_ids"], "->", case["greedy_ids"])


if __name__ == "__main__":
    main()
