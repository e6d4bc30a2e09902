"""Run methods x generation lengths side by side: same model, prompt, sampling and seed,
interleaved run by run after a warm-up, with transformers' `generate` as the peers.

A method is named as on the command line, optionally with options for this entry alone:
`tokenswift[ngram_top_k=0]` runs tokenswift without n-gram chains beside plain `tokenswift`;
`draft[verify=rejection]` verifies by rejection sampling instead of matching.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ..api import generate
from ..device.memory import PeakMemory
from ..drafters import METHODS, VERIFY_MODES, check_arguments
from ..drafters.registry import parse_assignment
from ..sampling.logits import SamplingConfig
from .metrics import answer_end, distinct_n, is_loop
from .peers import PEERS, Peers, peer_status

WARMUP_TOKENS = 16



@dataclass(frozen=True)
class Entry:
    label: str               # as given, e.g. "tokenswift[ngram_top_k=0]"
    method: str              # our method name or a peer
    options: dict = field(default_factory=dict)
    verify: str = "match"    # "rejection" for methods that carry their draft distribution


def split_entries(text: str) -> list[str]:
    """'ar,draft[max_nodes=17,max_depth=16]' -> its entries: commas inside brackets stay."""
    return [m.strip() for m in re.split(r",(?![^\[]*\])", text) if m.strip()]


def parse_entry(spec: str, shared: dict) -> Entry:
    """'name' or 'name[key=value,...]'; `shared` options go to every method that takes them."""
    match = re.fullmatch(r"([\w-]+)(?:\[(.*)\])?", spec.strip())
    if not match:
        raise ValueError(f"bad method entry {spec!r}; use NAME or NAME[key=value,...]")
    name, opts = match.group(1), match.group(2)
    if name not in METHODS and name not in PEERS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join([*METHODS, *PEERS])}")
    options = {}
    if name in METHODS:
        accepted = METHODS[name].all_options()
        options = {k: v for k, v in shared.get(None, {}).items() if k in accepted}
        options.update(shared.get(name, {}))
    for pair in filter(None, (opts or "").split(",")):
        key, value = parse_assignment(pair, "NAME[KEY=VALUE,...]")
        options[key] = value
    if options and name in PEERS:
        raise ValueError(f"{name} takes no options")
    verify = options.pop("verify", "match")
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    if name in METHODS:
        METHODS[name].resolve(options)
    return Entry(spec.strip(), name, options, verify)


@dataclass
class RunSpec:
    entries: list[Entry]
    gen_lens: list[int]
    prompt: list[int]
    sampling: SamplingConfig
    seed: int = 0
    runs: int = 1


def _one(model, entry: Entry, spec: RunSpec, gen_len: int, draft_model, heads, peers) -> dict:
    device = model.device
    start = time.perf_counter()
    if entry.method in PEERS:
        with PeakMemory(device) as mem:
            tokens = peers.generate(entry.method, spec.prompt, gen_len, spec.sampling, spec.seed)
        stats, peak = {}, mem.peak
    else:
        method = METHODS[entry.method]
        res = generate(model, spec.prompt, max_new_tokens=gen_len, method=entry.method,
                       sampling=spec.sampling, seed=spec.seed, ignore_eos=True,
                       draft_model=draft_model if method.needs_draft_model else None,
                       heads=heads if method.needs_heads else None,
                       verify=entry.verify, options=entry.options)
        tokens, stats, peak = res.token_ids, res.stats, res.stats["peak_memory_bytes"]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "stats": stats, "peak": peak}


def run(model, spec: RunSpec, draft_model=None, heads=None, progress: bool = True) -> list[dict]:
    """Rows of results, one per entry x generation length (medians over runs)."""
    for entry in spec.entries:
        if entry.method in METHODS:
            method = METHODS[entry.method]
            if method.needs_draft_model and draft_model is None:
                raise ValueError(f"method {entry.method} needs --draft-model")
            check_arguments(method, draft_model=False, heads=False, verify=entry.verify)
    context = len(spec.prompt) + max(spec.gen_lens)
    statuses = {e.label: (peer_status(e.method, model, spec.sampling, context,
                                      draft_model is not None) if e.method in PEERS else "ok")
                for e in spec.entries}
    runnable = [e for e in spec.entries
                if statuses[e.label] == "ok" or statuses[e.label].startswith("approximate")]
    wanted = {e.method for e in runnable} & set(PEERS)
    peers = Peers(model, draft_model, wanted) if wanted else None
    for entry in runnable:                                     # warm-up
        _one(model, entry, spec, WARMUP_TOKENS, draft_model, heads, peers)
    total = len(spec.gen_lens) * spec.runs * len(runnable)
    bar = tqdm(total=total, desc="bench", disable=not progress, dynamic_ncols=True)
    collected: dict[tuple[str, int], list[dict]] = {}
    for gen_len in spec.gen_lens:
        for _ in range(spec.runs):
            for entry in runnable:                             # interleaved
                bar.set_postfix_str(f"{entry.label} @ {gen_len}")
                collected.setdefault((entry.label, gen_len), []).append(
                    _one(model, entry, spec, gen_len, draft_model, heads, peers))
                bar.update(1)
    bar.close()
    rows = []
    for gen_len in spec.gen_lens:
        for entry in spec.entries:
            rows.append(_row(entry, gen_len, collected.get((entry.label, gen_len), []),
                             statuses[entry.label], model.eos_token_ids))
    _add_speedups(rows)
    return rows


def _row(entry: Entry, gen_len: int, runs: list[dict], status: str, eos_token_ids) -> dict:
    row = {"method": entry.label, "gen_len": gen_len, "status": status, "runs": len(runs)}
    if not runs:
        return row
    seconds = statistics.median(r["seconds"] for r in runs)
    last = runs[-1]
    stats = last["stats"]
    row.update(
        seconds=round(seconds, 4),
        tokens_per_s=round(len(last["tokens"]) / seconds, 2),
        new_tokens=len(last["tokens"]),
        acceptance_rate=(round(stats["acceptance_rate"], 4)
                         if stats.get("acceptance_rate") is not None else None),
        mean_accepted_length=round(stats["mean_accepted_length"], 3) if stats else None,
        peak_memory_bytes=max(r["peak"] for r in runs),
        **{f"distinct_{n}": round(distinct_n(last["tokens"], n), 4) for n in range(1, 5)},
        # end-of-sequence is ignored: where the answer ended, and whether what was timed
        # after it became a loop
        answer_end=answer_end(last["tokens"], eos_token_ids), loop=is_loop(last["tokens"]),
    )
    method_stats = METHODS[entry.method].stats if entry.method in METHODS else ()
    for key in (*method_stats, "verify_forward_s", "sizing_s", "decode_s", "prefill_s",
                "mean_tree_nodes"):
        value = stats.get(key)
        if value is not None:
            row[key] = round(value, 4) if isinstance(value, float) else value
    if stats.get("verify_forward_s") and stats.get("decode_s"):
        # drafting and bookkeeping: everything a step does besides the verify forward
        row["outside_verify_share"] = round(1 - stats["verify_forward_s"] / stats["decode_s"], 3)
    return row


def _add_speedups(rows: list[dict]) -> None:
    by_len: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_len.setdefault(row["gen_len"], {})[row["method"]] = row
    for row in rows:
        if "seconds" not in row:
            continue
        peers = by_len[row["gen_len"]]
        for base in ("ar", "hf"):
            ref = peers.get(base)
            if ref is not None and "seconds" in ref:
                row[f"speedup_vs_{base}"] = round(ref["seconds"] / row["seconds"], 3)
