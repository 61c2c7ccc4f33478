#!/usr/bin/env python3
"""Runs THERE (the GPU machine): a Qwen2.5-Coder-1.5B-shaped Hugging Face directory with random
weights, for speed runs that both Starling and vLLM serve (weight values do not change speed).

transformers builds Qwen2ForCausalLM from the 1.5B config (random init on the GPU, bf16) and
save_pretrained writes config.json + model.safetensors (one shard; tied embeddings, so no
lm_head); the real Qwen2 tokenizer files (scripts/device/make_tokenizer_qwen.sh, carried in
.device/qwen_tokenizer/) are copied beside them.
    usage: python3 make_synthetic_qwen.py TOKENIZER_DIR OUT_DIR
"""

import json
import os
import shutil
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

tokenizer_dir, out = sys.argv[1:3]
started = time.time()
THETA = 1000000.0
shape = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    head_dim=128,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151645,
)
# transformers 5 takes RoPE as rope_parameters, 4.x as rope_theta; config.json is fixed below
# either way, so both engines read theta 1e6.
config = Qwen2Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": THETA})
config.architectures = ["Qwen2ForCausalLM"]
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = Qwen2ForCausalLM(config)
model = model.to(torch.bfloat16)
os.makedirs(out, exist_ok=True)
model.save_pretrained(out, max_shard_size="20GB")
path = os.path.join(out, "config.json")
written = json.load(open(path))
written["rope_theta"] = THETA
if isinstance(written.get("rope_parameters"), dict):
    written["rope_parameters"]["rope_theta"] = THETA
written["use_sliding_window"] = False
json.dump(written, open(path, "w"), indent=1)
assert [n for n in os.listdir(out) if n.endswith(".safetensors")] == ["model.safetensors"], os.listdir(out)
for name in os.listdir(tokenizer_dir):
    shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))
params = sum(p.numel() for p in model.parameters())
print(f"synthetic Qwen2.5-Coder-1.5B ({params / 1e9:.2f} B parameters) in {out}: "
      f"{sorted(os.listdir(out))}, {time.time() - started:.1f} s", flush=True)
