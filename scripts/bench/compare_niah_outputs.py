#!/usr/bin/env python3
"""Cell-by-cell comparison of two `starling bench niah` runs on the same grid (e.g. STAR-KV
through the reference path and through the latent path): identical greedy tokens, where the
first differing token is, the facts found by each, and the KV bytes each cell held at its peak.

usage: compare_niah_outputs.py A_DIR_OR_JSON B_DIR_OR_JSON OUT_MD [--labels A,B]
"""
import json
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "niah_results.json")
    with open(path) as f:
        return json.load(f)


def main():
    a_path, b_path, out = sys.argv[1:4]
    labels = ["A", "B"]
    if "--labels" in sys.argv:
        labels = sys.argv[sys.argv.index("--labels") + 1].split(",")
    a, b = load(a_path), load(b_path)
    key = lambda c: (c["method"], c["context_tokens"], c["depth_percent"])
    b_cells = {key(c): c for c in b["cells"]}
    rows, same, facts_a, facts_b, bytes_a, bytes_b, missing = [], 0, 0.0, 0.0, 0, 0, 0
    for ca in a["cells"]:
        cb = b_cells.get(key(ca))
        if cb is None:
            missing += 1
            continue
        ia, ib = ca["output_ids"], cb["output_ids"]
        first = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
        if first is None and len(ia) != len(ib):
            first = min(len(ia), len(ib))
        same += first is None
        facts_a += ca["fact_score"]
        facts_b += cb["fact_score"]
        bytes_a += ca["kv_bytes_peak"]
        bytes_b += cb["kv_bytes_peak"]
        if first is not None:
            rows.append(
                f"| {ca['context_tokens']} | {ca['depth_percent']:.0f} | {first} | "
                f"{ca['fact_score']:.2f} | {cb['fact_score']:.2f} | {ca['answer'][:60]!r} | {cb['answer'][:60]!r} |"
            )
    n = len(a["cells"]) - missing
    lines = [
        f"{labels[0]}: {a.get('model_compression')}  ",
        f"{labels[1]}: {b.get('model_compression')}  ",
        f"device {a.get('device')}; {n} cells compared ({missing} missing in {labels[1]})",
        "",
        f"- identical greedy tokens: {same} / {n}",
        f"- facts found: {labels[0]} {facts_a:.1f}, {labels[1]} {facts_b:.1f}",
        f"- KV bytes held at peak (sum over cells): {labels[0]} {bytes_a / 2**20:.1f} MiB, "
        f"{labels[1]} {bytes_b / 2**20:.1f} MiB ({bytes_a / max(bytes_b, 1):.2f}x)",
    ]
    if rows:
        lines += [
            "",
            f"| context | depth % | first differing token | fact {labels[0]} | fact {labels[1]} | answer {labels[0]} | answer {labels[1]} |",
            "|---:|---:|---:|---:|---:|---|---|",
        ] + rows
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
