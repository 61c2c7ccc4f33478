#!/usr/bin/env python3
"""Dense FlashAttention-2 baseline (PyTorch SDPA, flash backend, bf16) on the shapes of
`starling bench kernels`, timed with CUDA events (median of 20 after warm-up), in the same device
session. Decode: one query token over `seq` keys. Prefill chunk: `query` new tokens over `seq`
keys with a bottom-right causal mask (the chunk sees all earlier context).

usage: fa2_baseline.py OUT_JSON [--quick]
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def run(label, hq, hkv, d, batch, seq, query):
    q = torch.randn(batch, hq, query, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, seq, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, hkv, seq, d, device="cuda", dtype=torch.bfloat16)
    mask = None if query == 1 else causal_lower_right(query, seq)
    gqa = hq != hkv

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if mask is None:
                F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            else:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    try:
        ms = median_ms(call)
        err = None
    except RuntimeError as e:  # e.g. no flash kernel for this combination
        ms, err = None, str(e).splitlines()[0]
    kv_bytes = batch * seq * hkv * d * 2 * 2
    return {
        "shape": label, "batch": batch, "seq_tokens": seq, "query_tokens": query,
        "median_ms": ms, "kv_bytes": kv_bytes,
        "achieved_tb_s": (kv_bytes / (ms * 1e-3) / 1e12) if ms else None, "error": err,
    }


def main():
    out, quick = sys.argv[1], "--quick" in sys.argv
    # Qwen 12/2x128: the dense counterpart of the Qwen2.5-Coder-1.5B latent rows.
    shapes = [("MHA 32x128", 32, 32, 128), ("GQA 32/8x128", 32, 8, 128), ("Qwen 12/2x128", 12, 2, 128)]
    seqs = [1024, 8192] if quick else [1024, 2048, 4096, 8192]
    batches = [1, 64] if quick else [1, 16, 64]
    rows = []
    for label, hq, hkv, d in shapes:
        points = [(b, s, 1) for s in seqs for b in batches] + [(1, 32768, 1), (20, 32768, 1)]
        points += [(b, s, c) for s in (8192, 32768) for b in (1, 4) for c in (128, 512)]
        for b, s, c in points:
            rows.append(run(label, hq, hkv, d, b, s, c))
            torch.cuda.empty_cache()
    json.dump({"bench": "fa2_baseline", "torch": torch.__version__,
               "device": torch.cuda.get_device_name(), "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
