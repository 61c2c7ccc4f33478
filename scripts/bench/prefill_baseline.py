#!/usr/bin/env python3
"""Causal prefill baselines (issue 21): FlashAttention-2 (PyTorch SDPA, flash
backend, contiguous K/V) and, where vLLM is importable, vLLM's FlashAttention-3
(`vllm.vllm_flash_attn.flash_attn_varlen_func`, fa_version=3, K/V paged in blocks of 16 as vLLM
serves them), bf16, on the points of `starling bench kernels --prompt-prefill`: whole prompts, and
the last chunk of a long prompt (queries at the end of a longer context, bottom-right causal, as
a chunked-prefill step attends; FA2 then through SDPA's lower-right causal bias). CUDA-event
medians of 20 after warm-up. With --starling, also writes the joined markdown table (once per
--starling: one run of the bench per Starling kernel).

usage: prefill_baseline.py OUT_JSON [--starling STARLING_JSON OUT_MD]...
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2_baseline import median_ms  # the same timing as the decode/chunk baseline

# Must match the bench's shapes and PROMPT_PREFILL_POINTS (bench_gpu.rs).
SHAPES = [("MHA 32x128", 32, 32, 128), ("GQA 32/8x128", 32, 8, 128), ("Qwen 12/2x128", 12, 2, 128)]
# (batch, context tokens, query tokens).
POINTS = [(1, 4096, 4096), (2, 4096, 4096), (1, 16384, 16384), (1, 24576, 24576),
          (1, 16384, 8192), (1, 24576, 8192)]
BLOCK = 16


def causal_flops(batch, tokens, query, heads, d):
    # Query i of the last `query` sees tokens - query + i + 1 keys; two products of 2 flops per
    # multiply-add (bench_attention's count).
    visible = query * (tokens - query) + query * (query + 1) / 2
    return 4.0 * batch * visible * heads * d


def fa2_ms(hq, hkv, d, batch, tokens, query):
    q = torch.randn(batch, hq, query, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, tokens, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, hkv, tokens, d, device="cuda", dtype=torch.bfloat16)
    if query == tokens:
        causal = {"is_causal": True}
    else:
        from torch.nn.attention.bias import causal_lower_right
        causal = {"attn_mask": causal_lower_right(query, tokens)}

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv, **causal)

    return median_ms(call)


def fa3_ms(varlen, hq, hkv, d, batch, tokens, query):
    blocks_per_seq = (tokens + BLOCK - 1) // BLOCK
    q = torch.randn(batch * query, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch * blocks_per_seq, BLOCK, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * query
    used = torch.full((batch,), tokens, device="cuda", dtype=torch.int32)
    # A shuffled block table, as a serving cache's blocks are.
    table = torch.randperm(batch * blocks_per_seq, device="cuda", dtype=torch.int32)
    table = table.view(batch, blocks_per_seq)

    def call():
        varlen(q, k, v, max_seqlen_q=query, cu_seqlens_q=cu_q, max_seqlen_k=tokens,
               seqused_k=used, causal=True, block_table=table, fa_version=3)

    return median_ms(call)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--starling", nargs=2, action="append", default=[],
                   metavar=("STARLING_JSON", "OUT_MD"))
    args = p.parse_args()
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func as varlen
        fa3_error = None
    except Exception as e:  # noqa: BLE001 - any import failure means no FA3 rows
        varlen, fa3_error = None, f"vLLM's FA3 not importable: {str(e).splitlines()[0]}"
    rows = []
    for label, hq, hkv, d in SHAPES:
        for batch, tokens, query in POINTS:
            row = {"shape": label, "batch": batch, "prompt_tokens": tokens, "query_tokens": query,
                   "flops": causal_flops(batch, tokens, query, hq, d)}
            for name, fn in (("fa2", lambda: fa2_ms(hq, hkv, d, batch, tokens, query)),
                             ("fa3", lambda: fa3_ms(varlen, hq, hkv, d, batch, tokens, query))):
                if name == "fa3" and varlen is None:
                    row["fa3_ms"], row["fa3_error"] = None, fa3_error
                    continue
                try:
                    row[f"{name}_ms"] = fn()
                except (RuntimeError, ValueError, NotImplementedError) as e:
                    row[f"{name}_ms"], row[f"{name}_error"] = None, str(e).splitlines()[0]
                torch.cuda.empty_cache()
            rows.append(row)
            print(row)
    doc = {"bench": "prefill_baseline", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "rows": rows}
    json.dump(doc, open(args.out, "w"), indent=1)
    for ours, out_md in args.starling:
        merge(doc, json.load(open(ours)), out_md)


def merge(base, ours, out_md):
    index = {(r["shape"], r["batch"], r["prompt_tokens"], r.get("query_tokens", r["prompt_tokens"])): r
             for r in base["rows"]}
    fmt = lambda x, spec: format(x, spec) if x else "n/a"  # noqa: E731
    lines = [
        f"Device: {ours['device']}; Starling kernel: {ours.get('prefill_kernel')}; "
        f"FA2 = PyTorch {base['torch']} SDPA flash (contiguous K/V); "
        "FA3 = vLLM's flash_attn_varlen_func, fa_version=3, K/V paged in blocks of 16. "
        "Causal, bf16 (query < prompt: the last chunk of the prompt, bottom-right causal); "
        "ratios > 1: Starling faster.",
        "",
        "| shape | batch | prompt | query | Starling ms | TFLOP/s | FA2 ms | FA3 ms | FA3 TFLOP/s | FA2 / Starling | FA3 / Starling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for item in ours["rows"]:
        r = item["row"]
        b = index.get((item["shape"], r["batch"], r["seq_tokens"], r["query_tokens"]), {})
        f2, f3, ms = b.get("fa2_ms"), b.get("fa3_ms"), r["median_ms"]
        f3_tf = b["flops"] / (f3 * 1e-3) / 1e12 if f3 else None
        lines.append(
            f"| {item['shape']} | {r['batch']} | {r['seq_tokens']} | {r['query_tokens']} | {ms:.3f} | "
            f"{r['achieved_tflops']:.0f} | {fmt(f2, '.3f')} | {fmt(f3, '.3f')} | "
            f"{fmt(f3_tf, '.0f')} | {fmt(f2 and f2 / ms, '.2f')} | {fmt(f3 and f3 / ms, '.2f')} |"
        )
    open(out_md, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
