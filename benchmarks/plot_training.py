"""Plot the loss curves of the demo models and of the bundled drafters from their records.

    python benchmarks/plot_training.py docs/training_loss.png docs/drafters_loss.png

The first figure: the demo models and the demo heads; the second: every drafter bundled under
`longspec/zoo/drafters/` (SmolLM2's heads) and kept under `training/drafters/` (SmolLM2's
EAGLE drafter), train loss per step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

import longspec
from longspec.heads.store import ZOO_DRAFTERS

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(out: str) -> None:
    fig, (ax, heads_ax) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=80)
    for name in ("demo", "demo-draft"):
        record = json.loads((longspec.demo_path(name) / "training.json").read_text())
        log = record["log"]
        ax.plot([e["step"] for e in log], [e["train_loss"] for e in log], label=f"{name} train")
        val = [e for e in log if "val_loss" in e]
        ax.plot([e["step"] for e in val], [e["val_loss"] for e in val], "o--",
                label=f"{name} held out")
    label(ax, "cross-entropy (nats)")
    heads = json.loads((longspec.demo_path("demo").parent / "heads" / "heads.json").read_text())
    heads_ax.plot(heads["loss_curve"], label=f"demo heads ({heads['training']['target']})")
    label(heads_ax, "sum of 3 heads' losses (nats)")
    save(fig, out)


def plot_drafters(out: str) -> None:
    kept = Path(__file__).resolve().parent.parent / "training" / "drafters"
    records = sorted(ZOO_DRAFTERS.glob("*/*/*.json")) + sorted(kept.glob("*/*.json"))
    fig, axes = plt.subplots(1, len(records), figsize=(5 * len(records), 3.5), dpi=80,
                             squeeze=False)
    for ax, path in zip(axes[0], records):
        record = json.loads(path.read_text())
        ax.plot(record["loss_curve"], label="train")
        ax.axhline(record["held_out_loss_after"], color="C1", ls="--", label="held out, after")
        ax.set_title(f"{record['kind']} ({path.parent.relative_to(path.parents[2])})", fontsize=9)
        label(ax, "loss (nats)")
    save(fig, out)


def label(ax, ylabel: str) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def save(fig, out: str) -> None:
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


if __name__ == "__main__":
    main(sys.argv[1])
    plot_drafters(sys.argv[2])
