#!/usr/bin/env python3
"""Joins `starling bench kernels` JSON with fa2_baseline.py JSON (same run) into one markdown
table with the ratio FA2 time / Starling time (> 1 means Starling is faster).

usage: merge_kernels.py STARLING_JSON FA2_JSON OUT_MD
"""
import json
import sys

ours = json.load(open(sys.argv[1]))
fa2 = json.load(open(sys.argv[2]))
copy = ours["copy_tb_s"]
index = {(r["shape"], r["batch"], r["seq_tokens"], r["query_tokens"]): r for r in fa2["rows"]}
lines = [
    f"Device: {ours['device']}; copy bandwidth {copy:.2f} TB/s measured in the same run; "
    f"FA2 = PyTorch {fa2['torch']} SDPA flash backend (dense, bf16).",
    "",
    "| kind | shape | batch | seq | query | Starling ms | TB/s | % copy | FA2 ms | FA2 % copy | FA2 / Starling |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for item in ours["attention"]:
    r, shape = item["row"], item["shape"]
    f = index.get((shape, r["batch"], r["seq_tokens"], r["query_tokens"]), {})
    fms = f.get("median_ms")
    fa2_ms = f"{fms:.4f}" if fms else "n/a"
    ratio = f"{fms / r['median_ms']:.2f}" if fms else "n/a"
    fpct = f"{100 * f['achieved_tb_s'] / copy:.0f}%" if fms else (f.get("error") or "n/a")
    lines.append(
        f"| {r['kind']} | {shape} | {r['batch']} | {r['seq_tokens']} | {r['query_tokens']} | "
        f"{r['median_ms']:.4f} | {r['achieved_tb_s']:.2f} | {100 * r['achieved_tb_s'] / copy:.0f}% | "
        f"{fa2_ms} | {fpct} | {ratio} |"
    )
lines += ["", "| KV write | tokens | write ms | copy ms | write / copy |", "|---|---:|---:|---:|---:|"]
for item in ours["kv_write"]:
    r = item["row"]
    lines.append(f"| {item['shape']} | {r['tokens']} | {r['write_ms']:.4f} | {r['copy_ms']:.4f} | {r['ratio_to_copy']:.2f} |")
if ours.get("fp8_attention"):
    lines += [
        "",
        "fp8 cache (`--kv-cache-dtype fp8`) beside bf16 and FA2 (bf16), same run:",
        "",
        "| kind | shape | batch | seq | query | bf16 ms | fp8 ms | bf16 / fp8 | FA2 ms | FA2 / fp8 | fp8 KV GB/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
for item in ours.get("fp8_attention", []):
    b, q, shape = item["bf16"], item["fp8"], item["shape"]
    f = index.get((shape, q["batch"], q["seq_tokens"], q["query_tokens"]), {})
    fms = f.get("median_ms")
    fa2_ms = f"{fms:.4f}" if fms else "n/a"
    vs_fa2 = f"{fms / q['median_ms']:.2f}" if fms else "n/a"
    lines.append(
        f"| {q['kind']} | {shape} | {q['batch']} | {q['seq_tokens']} | {q['query_tokens']} | "
        f"{b['median_ms']:.4f} | {q['median_ms']:.4f} | {item['speedup_vs_bf16']:.2f} | "
        f"{fa2_ms} | {vs_fa2} | {q['achieved_tb_s'] * 1000:.0f} |"
    )
if ours.get("fp8_kv_write"):
    lines += ["", "| fp8 KV write | tokens | bf16 ms | fp8 ms | fp8 / bf16 |", "|---|---:|---:|---:|---:|"]
for item in ours.get("fp8_kv_write", []):
    b, q = item["bf16"], item["fp8"]
    lines.append(f"| {item['shape']} | {q['tokens']} | {b['write_ms']:.4f} | {q['write_ms']:.4f} | {q['write_ms'] / b['write_ms']:.2f} |")
lines += [
    "",
    "STAR-KV latent attention beside the dense kernel of the same heads and FA2 (dense), same run:",
    "",
    "| latent shape | kind | batch | seq | query | latent ms | dense ms | FA2 ms | latent vs dense | latent vs FA2 | byte ratio | latent % copy |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for item in ours.get("latent_attention", []):
    r = item["row"]
    lat, den = r["latent"], r["dense"]
    f = index.get((item["dense_shape"], lat["batch"], lat["seq_tokens"], lat["query_tokens"]), {})
    fms = f.get("median_ms")
    fa2_ms = f"{fms:.4f}" if fms else "n/a"
    vs_fa2 = f"{fms / lat['median_ms']:.2f}x" if fms else "n/a"
    lines.append(
        f"| {item['shape']} | {lat['kind']} | {lat['batch']} | {lat['seq_tokens']} | {lat['query_tokens']} | "
        f"{lat['median_ms']:.4f} | {den['median_ms']:.4f} | {fa2_ms} | "
        f"{r['speedup_vs_dense']:.2f}x | {vs_fa2} | "
        f"{r['byte_ratio']:.2f}x | {100 * lat['achieved_tb_s'] / copy:.0f}% |"
    )
lines += ["", "| latent projection + write | tokens | latent ms | dense ms | latent / dense |", "|---|---:|---:|---:|---:|"]
for item in ours.get("latent_write", []):
    r = item["row"]
    lines.append(f"| {item['shape']} | {r['tokens']} | {r['latent_ms']:.4f} | {r['dense_ms']:.4f} | {r['ratio_to_dense']:.2f} |")
open(sys.argv[3], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
