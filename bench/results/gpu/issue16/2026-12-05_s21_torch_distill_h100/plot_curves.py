"""Loss curves of the H100 distillation run: per step KL (and soft rank against the budget) of
the threshold phase, and KL of the refinement phase, for each profile. Reads records/ here."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = os.path.dirname(os.path.abspath(__file__))
runs = {
    "35% removed": ("ckpt_t", "removed-35pct"),
    "50% removed": ("ckpt_t", "removed-50pct"),
    "60% removed": ("ckpt_t60", "removed-60pct"),
}
fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
for label, (ckpt, profile) in runs.items():
    rec = os.path.join(here, "records", f"{ckpt}__.torch-job__{profile}__")
    thresholds = json.load(open(rec + "thresholds.json"))["steps"]
    refine = json.load(open(rec + "refine.json"))["steps"]
    job = json.load(open(os.path.join(here, "records", f"{ckpt}__.torch-job__job.json")))
    target = next(p["target_elements"] for p in job["profiles"] if p["name"] == profile)
    axes[0].plot([s["step"] for s in thresholds], [s["kl"] for s in thresholds], label=label)
    axes[1].plot([s["step"] for s in thresholds], [s["soft_rank"] / target for s in thresholds], label=label)
    axes[2].plot([s["step"] for s in refine], [s["kl"] for s in refine], label=label)
axes[0].set_title("thresholds: KL per step (nats/token, training windows)")
axes[1].set_title("thresholds: soft rank / budget")
axes[1].axhline(1.0, color="grey", lw=0.8)
axes[2].set_title("refinement: KL per step (nats/token)")
for ax in axes:
    ax.set_xlabel("step (2 windows x 4096 tokens)")
    ax.legend()
fig.suptitle("STAR-KV distillation by PyTorch, Qwen2.5-Coder-1.5B, NVIDIA H100, 2026-12-05")
fig.tight_layout()
fig.savefig(os.path.join(here, "loss_curves.png"), dpi=90)
print("wrote loss_curves.png", file=sys.stderr)
