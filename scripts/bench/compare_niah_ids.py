#!/usr/bin/env python3
"""Cell-by-cell greedy-token comparison of a `starling bench niah` run (niah_results.json) and
scripts/niah_kvpress.py answers to the same prompts: which cells generate the same tokens, and
where the first differing token is. Exit status 1 when any cell differs.

usage: compare_niah_ids.py NIAH_RESULTS_JSON KVPRESS_ANSWERS_JSON
"""
import json
import sys


def key(cell):
    return (cell["method"], cell["context_tokens"], cell["depth_percent"])


def main() -> int:
    with open(sys.argv[1]) as f:
        ours = json.load(f)["cells"]
    with open(sys.argv[2]) as f:
        theirs = {key(c): c for c in json.load(f)["cells"]}
    same = 0
    for cell in ours:
        a, b = cell["output_ids"], theirs[key(cell)]["output_ids"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        verdict = "same" if a == b else f"first difference at token {first}"
        same += a == b
        print(f"{key(cell)}: {verdict} ({len(a)} vs {len(b)} tokens) {cell['answer'][:40]!r}")
    print(f"{same} of {len(ours)} cells generate the same tokens")
    return 0 if same == len(ours) else 1


if __name__ == "__main__":
    sys.exit(main())
