"""Plot tokens/s against position from long_bench.py's records (the long-generation figures).

Tokens/s against position from long_bench.py's records: one line per method and record,
labelled with the record's file name.

    python benchmarks/plot_long.py 8k_run.json 32k_run.json --out docs/bench/long_qwen.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=80)
    for path in args.records:
        record = json.loads(Path(path).read_text())
        for row in record["rows"]:
            ends = [s["to"] for s in row["segments"]]
            starts = [0, *ends[:-1]]
            middles = [(a + b) / 2 for a, b in zip(starts, ends)]
            ax.plot(middles, [s["tok_s"] for s in row["segments"]], marker=".",
                    label=f"{Path(path).stem}: {row['method']} ({record['setting']}, "
                          f"{row['new_tokens']:,} tokens)")
    ax.set_xlabel("new tokens written")
    ax.set_ylabel("tokens/s over each segment")
    ax.set_title(f"{record['model']}, {record['kernel_profile']['isa']} CPU, "
                 f"{record['threads']} threads")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
