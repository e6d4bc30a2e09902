"""Benchmark outputs: results.json, results.md and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from .metrics import DEGENERATE

COLUMNS = [("method", "method"), ("gen_len", "new tokens"), ("seconds", "s"),
           ("tokens_per_s", "tok/s"), ("speedup_vs_ar", "vs ar"), ("speedup_vs_hf", "vs hf"),
           ("acceptance_rate", "alpha"), ("mean_accepted_length", "len"), ("distinct_1", "D-1"),
           ("distinct_2", "D-2"), ("distinct_3", "D-3"), ("distinct_4", "D-4"),
           ("answer_end", "answer ended"),
           ("peak_memory_bytes", "peak MiB"), ("status", "status")]


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key == "peak_memory_bytes":
        return f"{value / 2**20:.0f}"
    if key == "status":
        return "" if value == "ok" else value
    if key == "answer_end":
        return f"token {value}"
    if key == "distinct_4" and value < DEGENERATE:
        return f"{value:g} (a loop)"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown(report: dict) -> str:
    lines = [f"# longspec bench: {report['model']}", "",
             f"`{report['command']}`", "",
             (f"device {report['device']}, dtype {report['dtype']}, "
             f"prompt {report['prompt_len']} tokens, "
             f"sampling {report['sampling']}, seed {report['seed']}, {report['runs']} run(s) each "
             f"(median), memory bandwidth {report['bandwidth_gb_s']:.1f} GB/s"), ""]
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in report["results"]:
        lines.append("| " + " | ".join(_cell(k, row.get(k)) for k, _ in COLUMNS) + " |")
    lines += ["",
              "Roofline of plain decoding (weights + KV bytes per token / measured bandwidth):", "",
              "| new tokens | roofline s | ar s | ar / roofline |", "|---|---|---|---|"]
    for r in report["roofline"]:
        ratio = f"{r['ar_over_roofline']:.2f}" if r.get("ar_over_roofline") else "-"
        ar = f"{r['ar_seconds']:.2f}" if r.get("ar_seconds") else "-"
        lines.append(f"| {r['gen_len']} | {r['roofline_seconds']:.2f} | {ar} | {ratio} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    panels = [("speedup_vs_ar", "speedup over ar", "speedup.png"),
              ("acceptance_rate", "acceptance rate (alpha)", "acceptance.png"),
              ("tokens_per_s", "tokens / s", "tokens_per_s.png")]
    methods = list(dict.fromkeys(r["method"] for r in report["results"]))
    for key, label, name in panels:
        fig, ax = plt.subplots(figsize=(8, 4), dpi=80)
        for i, m in enumerate(methods):
            pts = [(r["gen_len"], r[key]) for r in report["results"]
                   if r["method"] == m and r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                # ten colours, then the same colours dashed, then dotted
                ax.plot(xs, ys, marker="o", label=m, linestyle=("-", "--", ":")[i // 10 % 3])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_lines():       # a panel of peers only (no acceptance) has no line
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title(f"{report['model']} ({report['device']}, {report['dtype']})", fontsize=9)
        fig.tight_layout()
        path = out / name
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def write(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "results.md").write_text(markdown(report))
    return [out / "results.json", out / "results.md", *plot(report, out)]
