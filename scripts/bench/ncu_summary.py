#!/usr/bin/env python3
"""Summarises `ncu --csv --page raw` output of `starling bench decode` at one batch size: cuts one
decode step out of the kernel stream (a step runs from the embedding gather to its sampling
kernel) and prints the GPU time and DRAM bytes per kernel name, with the bandwidth each kernel
reached. Usage: ncu_summary.py decode_ncu.csv"""
import csv
import statistics
import sys
from collections import OrderedDict


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.DictReader(lines)
    out = []
    for r in reader:
        try:
            dur_ns = float(r["gpu__time_duration.sum"].replace(",", ""))
        except (KeyError, ValueError):
            continue  # the units row
        read = float(r.get("dram__bytes_read.sum", "0").replace(",", "") or 0)
        write = float(r.get("dram__bytes_write.sum", "0").replace(",", "") or 0)
        name = r["Kernel Name"].split("(")[0].strip()
        out.append((name, dur_ns, read + write, r.get("Grid Size", ""), r.get("Block Size", "")))
    return out


def main():
    kernels = rows(sys.argv[1])
    # A step opens with the embedding gather and closes with the sampling kernel (a gather of
    # the logits rows may sit in between; with every row sampled it is a plain copy instead).
    steps, start = [], None
    for i, k in enumerate(kernels):
        if start is None and k[0].startswith("gather_rows"):
            start = i
        elif start is not None and k[0].startswith("sample_rows"):
            seg = kernels[start:i + 1]
            if any("attention" in s[0] for s in seg):
                steps.append(seg)
            start = None
    if not steps:
        print(f"no decode step found among {len(kernels)} kernels")
        return
    totals = [sum(k[1] for k in s) for s in steps]
    med = statistics.median(totals)
    step = min(steps, key=lambda s: abs(sum(k[1] for k in s) - med))
    print(f"{len(kernels)} kernels profiled, {len(steps)} steps found; step of median time: "
          f"{len(step)} kernels, {med / 1e3:.1f} µs of kernel time (no launch gaps)\n")
    by = OrderedDict()
    for name, dur, byts, grid, block in step:
        key = (name, grid, block)
        c = by.setdefault(key, [0, 0.0, 0.0])
        c[0] += 1
        c[1] += dur
        c[2] += byts
    print("| kernel | grid | block | launches | total µs | share | µs each | DRAM MB | TB/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, grid, block), (n, dur, byts) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {grid} | {block} | {n} | {dur / 1e3:.1f} | {100 * dur / med:.1f}% | "
              f"{dur / n / 1e3:.2f} | {byts / 1e6:.1f} | {byts / dur / 1e3 if dur else 0:.2f} |")


if __name__ == "__main__":
    main()
