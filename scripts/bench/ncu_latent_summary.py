#!/usr/bin/env python3
"""Summarises `ncu --csv --page raw` output of `starling bench kernels --latent-only`: per
(kernel name, grid, block) in order of first appearance, the launches seen, their median GPU
time and DRAM bytes and the bandwidth reached. Consecutive groups belong to one bench point (the
dense kernel of the point, then the latent launches). Usage: ncu_latent_summary.py latent_ncu.csv"""
import csv
import statistics
import sys
from collections import OrderedDict


def main():
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    groups = OrderedDict()
    for r in csv.DictReader(lines):
        try:
            dur_ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        except (KeyError, ValueError):
            continue  # the units row
        read = float(r.get("dram__bytes_read.sum", "0").replace(",", "") or 0)
        write = float(r.get("dram__bytes_write.sum", "0").replace(",", "") or 0)
        name = r["Kernel Name"].split("(")[0].strip()[:48]
        key = (name, r.get("Grid Size", ""), r.get("Block Size", ""))
        groups.setdefault(key, []).append((dur_ns, read + write))
    print("| kernel | grid | block | launches | median µs | DRAM MB | TB/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (name, grid, block), runs in groups.items():
        d = statistics.median(x[0] for x in runs)
        b = statistics.median(x[1] for x in runs)
        print(f"| {name} | {grid} | {block} | {len(runs)} | {d / 1e3:.1f} | {b / 1e6:.2f} | "
              f"{b / d / 1e3 if d else 0:.2f} |")


if __name__ == "__main__":
    main()
