#!/usr/bin/env python3
"""Summarises interleaved prefill A/B runs of scripts/device/kernel_ab.sh.

usage: prefill_ab_summary.py DIR

DIR holds `prefill_<arm>_r<N>.json` files (`starling bench kernels --prompt-prefill` output),
one per arm and repeat, the arms run in turn within each repeat. Prints, per row (shape, batch,
context, query), every arm's median TFLOP/s over its repeats and its ratio to the `builtin`
arm, then per arm the number of rows where its slowest repeat beats builtin's fastest (a
difference the run-to-run spread cannot explain) and the median ratio over rows.
"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = defaultdict(list)  # arm -> [rows of one repeat: {key: tflops}]
    for path in sorted(Path(sys.argv[1]).glob("prefill_*_r*.json")):
        m = re.fullmatch(r"prefill_(.+)_r(\d+)\.json", path.name)
        if not m:
            continue
        rows = {}
        for r in json.loads(path.read_text())["rows"]:
            row = r["row"]
            key = (r["shape"], row["batch"], row["seq_tokens"], row["query_tokens"])
            rows[key] = row["achieved_tflops"]
        runs[m.group(1)].append(rows)
    if "builtin" not in runs:
        sys.exit("no prefill_builtin_r*.json: nothing to compare against")
    arms = ["builtin"] + sorted(a for a in runs if a != "builtin")
    keys = list(runs["builtin"][0])
    repeats = {a: len(runs[a]) for a in arms}
    print(f"Repeats per arm: {repeats}. TFLOP/s, median over repeats (ratio to builtin).\n")
    print("| shape | batch | context | query | " + " | ".join(arms) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(arms))
    ratios = defaultdict(list)
    clear_wins = defaultdict(int)
    clear_losses = defaultdict(int)
    for key in keys:
        base = [r[key] for r in runs["builtin"] if key in r]
        base_med = statistics.median(base)
        cells = []
        for arm in arms:
            vals = [r[key] for r in runs[arm] if key in r]
            if not vals:
                cells.append("—")
                continue
            med = statistics.median(vals)
            if arm == "builtin":
                cells.append(f"{med:.0f}")
                continue
            ratio = med / base_med
            ratios[arm].append(ratio)
            if min(vals) > max(base):
                clear_wins[arm] += 1
            if max(vals) < min(base):
                clear_losses[arm] += 1
            cells.append(f"{med:.0f} ({ratio:.3f})")
        shape, batch, ctx, query = key
        print(f"| {shape} | {batch} | {ctx} | {query} | " + " | ".join(cells) + " |")
    print()
    for arm in arms[1:]:
        print(
            f"- {arm}: median ratio {statistics.median(ratios[arm]):.3f} over {len(ratios[arm])} rows; "
            f"every repeat above every builtin repeat on {clear_wins[arm]} rows, below on "
            f"{clear_losses[arm]}"
        )


if __name__ == "__main__":
    main()
