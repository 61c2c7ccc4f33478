#!/usr/bin/env python3
"""Summarises `ncu --import REPORT --page raw --csv` of a `--set full` report: per profiled
launch (kernel, grid), its time, DRAM and L2 traffic, hit rates, occupancy, issue and tensor
pipe activity, and the five largest warp stall reasons (cycles per issued instruction). Metrics
a report lacks print as "–". Usage: ncu_full_summary.py raw.csv [label]"""
import csv
import sys

COLUMNS = [
    ("µs", "gpu__time_duration.sum", 1e-3),
    ("DRAM MB", "dram__bytes_read.sum", 1e-6),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", 1),
    ("L1 hit %", "l1tex__t_sector_hit_rate.pct", 1),
    ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
    ("issue busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("L2 %", "lts__t_sectors.avg.pct_of_peak_sustained_elapsed", 1),
]
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def main():
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    head = "| arm | kernel | grid | " + " | ".join(c[0] for c in COLUMNS) + " | top stalls |"
    print(head)
    print("|---|---|---|" + "---:|" * len(COLUMNS) + "---|")
    for r in rows:
        if number(r.get("gpu__time_duration.sum")) is None:
            continue  # the units row
        cells = []
        for _, metric, factor in COLUMNS:
            v = number(r.get(metric))
            cells.append("–" if v is None else f"{v * factor:.1f}")
        stalls = sorted(
            ((number(v) or 0.0, k[len(STALL_PREFIX):-len(STALL_SUFFIX)])
             for k, v in r.items()
             if k and k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX)
             and "not_issued" not in k),
            reverse=True)[:5]
        top = ", ".join(f"{name} {v:.2f}" for v, name in stalls if v > 0) or "–"
        name = r.get("Kernel Name", "").split("(")[0].strip()[:40]
        print(f"| {label} | {name} | {r.get('Grid Size', '')} | " + " | ".join(cells)
              + f" | {top} |")


if __name__ == "__main__":
    main()
