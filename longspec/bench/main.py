"""`longspec bench`: assemble the run, measure the machine, write the report."""

from __future__ import annotations

import platform
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ..drafters.registry import parse_assignment
from .metrics import mean_roofline_ms, measure_bandwidth
from .prompts import prompt_ids
from .report import write
from .runner import RunSpec, parse_entry, run


def parse_shared_options(pairs: list[str]) -> dict:
    """'KEY=VALUE' for every method that takes KEY, 'METHOD:KEY=VALUE' for one method."""
    shared: dict = {}
    for pair in pairs:
        target, _, assignment = pair.rpartition(":") if ":" in pair else ("", "", pair)
        key, value = parse_assignment(assignment, "[METHOD:]KEY=VALUE")
        shared.setdefault(target or None, {})[key] = value
    return shared


def weight_bytes(model) -> int:
    """Bytes of weights one decoding step reads: every parameter and quantized buffer once,
    the embedding only when the LM head reads it (a lookup reads one row)."""
    net = model.net
    seen, total = set(), 0
    for t in [*net.parameters(), *net.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    head_reads_embed = any(t.data_ptr() == net.embed.data_ptr() for t in net.lm_head.parameters())
    return total if head_reads_embed else total - net.embed.numel() * net.embed.element_size()


def roofline(model, rows: list[dict], prompt_len: int, gen_lens: list[int],
             bandwidth: float) -> list[dict]:
    kv = model.config.kv_bytes_per_token(model.dtype.itemsize)
    out = []
    for gen_len in gen_lens:
        seconds = (mean_roofline_ms(weight_bytes(model), kv, prompt_len, gen_len, bandwidth)
                   * gen_len / 1e3)
        entry = {"gen_len": gen_len, "roofline_seconds": round(seconds, 4),
                 "roofline_ms_per_token": round(seconds * 1e3 / gen_len, 3)}
        ar = next((r for r in rows if r["method"] == "ar" and r["gen_len"] == gen_len
                   and "seconds" in r), None)
        if ar is not None:
            entry["ar_seconds"] = ar["seconds"]
            entry["ar_over_roofline"] = round(ar["seconds"] / seconds, 3)
        out.append(entry)
    return out


def versions() -> dict:
    import transformers

    from .. import __version__

    return {"longspec": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def run_bench(model, *, methods: list[str], gen_lens: list[int], prompt_len: int, out: Path,
              sampling, draft_model=None, heads=None, prompt_file: str | None = None,
              seed: int = 0, runs: int = 1, options: list[str] = (),
              progress: bool = True) -> list[Path]:
    if not gen_lens or any(n <= 0 for n in gen_lens):
        raise ValueError("--gen-lens takes positive integers, e.g. 2048,8192")
    if prompt_len <= 0 or runs <= 0:
        raise ValueError("--prompt-len and --runs must be positive")
    limit = model.config.context_limit
    if prompt_len + max(gen_lens) > limit:
        raise ValueError(f"prompt {prompt_len} + {max(gen_lens)} new tokens exceeds the model's "
                         f"context of {limit}")
    shared = parse_shared_options(options)
    entries = [parse_entry(m, shared) for m in methods]
    prompt = prompt_ids(model, prompt_len, prompt_file)
    spec = RunSpec(entries, sorted(gen_lens), prompt, sampling, seed, runs)
    bandwidth = measure_bandwidth(model.device)
    rows = run(model, spec, draft_model=draft_model, heads=heads, progress=progress)
    report = {
        "model": model.name, "model_path": str(model.path),
        "draft_model": draft_model.name if draft_model is not None else None,
        "device": str(model.device), "dtype": str(model.dtype).removeprefix("torch."),
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "prompt_len": prompt_len, "prompt_file": prompt_file, "sampling": asdict(sampling),
        "seed": seed, "runs": runs, "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "versions": versions(), "command": shlex.join(["longspec", *sys.argv[1:]]),
        "results": rows, "roofline": roofline(model, rows, prompt_len, spec.gen_lens, bandwidth),
    }
    return write(report, out)
