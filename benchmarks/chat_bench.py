"""Methods side by side on long chat answers, checked against `ar`; the benchmarks' prompts.

Methods side by side on chat prompts that ask for long answers, one process, with the
token-identity check against `ar` and transformers' generate (plain and prompt lookup) as peers.

Each run starts cold: what drafters learn across calls on a model (earlier outputs, the
recycling matrix, calibrations) is cleared before every generation, so no run profits from
an earlier run of the same prompt. Runs generate exactly --new-tokens tokens (EOS ignored);
each row says where `ar`'s answer first reached end-of-turn (`first_eos`), after which the
model continues with whatever it writes past the end of an answer, and the distinct-4 of the
tokens timed (`loop` where it is under 0.3: a row that times a loop, left out of the summary's
means). With --repeats N every
method runs N times and its run of median speed is reported, the upper median for even N (so
the faster of two; this machine's speed drifts by ~10% between runs); `sizing_s` is the time
each run spent timing steps for adaptive sizing. `ar` rows also give `weights_gb_s`, the
weight bandwidth a plain step achieves (every matrix read once per token, as gpt-fast prints it);
`verify_ms` and `other_ms` split a step's time into its verify forward and the rest (drafting,
sizing, bookkeeping).

    python benchmarks/chat_bench.py --model smollm2 --dtype bfloat16 --new-tokens 1024 \\
        --methods ar,auto,suffix,recycling,pld,hf,hf-pld --settings greedy,t07 --out chat.json

A method may carry options, as in `longspec bench`: `tokenswift[ngram_top_k=0]`; a method
named with `@heads` runs with the trained drafter of --heads (`auto@heads` beside `auto`: `auto`
with and without an EAGLE drafter), one ending in `@draft` with --draft-model (`auto@draft`:
`auto` with the draft model's chains among its sources). With --sharegpt
the prompts are the first questions of ShareGPT's held-out conversations (`longspec fetch
sharegpt`; those of 50 to 2,000 characters, in the file's order) instead of the ones below.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import longspec
from longspec.bench.metrics import answer_end, distinct_n, is_loop
from longspec.bench.peers import PEERS, Peers, peer_status
from longspec.bench.runner import parse_entry, split_entries
from longspec.drafters import METHODS
from longspec.models.sources import fetch_data
from longspec.request import encode_prompt
from longspec.zoo.sharegpt import conversations, held_out

PROMPTS = [
    ("Write a Python module that implements an LRU cache with a time-to-live for each entry, "
    "with docstrings, type hints and unit tests."),
    ("Explain in detail how the TCP three-way handshake, flow control and congestion control "
    "work, with examples."),
    "Write a long short story about a lighthouse keeper who discovers a message in a bottle.",
    ("Write a detailed tutorial on SQL joins (inner, left, right, full, cross, self) with "
    "example tables and queries for each."),
    ("Explain the causes, main events and consequences of the French Revolution, in a long "
    "essay with sections."),
    ("Write a JavaScript implementation of a to-do list web app (HTML, CSS and JS) and explain "
    "each part of the code."),
    ("Describe how a compiler works, from lexing and parsing to optimisation and code "
    "generation, with a small worked example."),
    ("Write a comprehensive guide to caring for houseplants: light, water, soil, pests and "
    "propagation, plant by plant."),
]
SETTINGS = {"greedy": longspec.SamplingConfig(temperature=0),
            "t07": longspec.SamplingConfig(temperature=0.7, top_p=0.9),
            "t1": longspec.SamplingConfig(temperature=1.0)}   # the server's default


def run_one(model, draft, peers, method: str, prompt_ids: list[int], n: int, sampling,
            heads: str | None = None) -> dict:
    model.state.clear()
    if method in PEERS:
        start = time.perf_counter()
        tokens = peers.generate(method, prompt_ids, n, sampling, seed=0)
        seconds = time.perf_counter() - start
        return {"tokens": tokens, "seconds": seconds, "tok_s": len(tokens) / seconds}
    method, with_draft = method.removesuffix("@draft"), method.endswith("@draft")
    method, with_heads = method.removesuffix("@heads"), method.endswith("@heads")
    entry = parse_entry(method, {})
    with_draft = with_draft or METHODS[entry.method].needs_draft_model
    res = longspec.generate(model, prompt_ids, max_new_tokens=n, method=entry.method,
                            options=entry.options, sampling=sampling, seed=0, ignore_eos=True,
                            heads=heads if with_heads else None,
                            draft_model=draft if with_draft else None)
    s = res.stats
    row = {"tokens": res.token_ids, "seconds": s["decode_s"], "tok_s": s["tokens_per_s"],
           "len": s["mean_accepted_length"], "nodes": s["mean_tree_nodes"],
           "sizing_s": round(s["sizing_s"], 3), "sources": s.get("sources")}
    if s["verify_forward_s"] is not None:       # timed on a CPU only (CUDA is asynchronous)
        # per step: the verify forward, and everything else (drafting, sizing, bookkeeping)
        row["verify_ms"] = round(1000 * s["verify_forward_s"] / s["steps"], 2)
        row["other_ms"] = round(1000 * (s["decode_s"] - s["verify_forward_s"]) / s["steps"], 2)
    return row


def weight_bytes(net) -> int:
    """What a plain decoding step reads of the weights: every layer's, the final norm's and the
    LM head's (the embedding only as a tied head: a lookup reads one row)."""
    tensors = {}
    for module in (net.layers, net.lm_head):
        for t in [*module.parameters(), *module.buffers()]:
            tensors[t.data_ptr()] = t.numel() * t.element_size()
    return sum(tensors.values()) + net.norm.numel() * net.norm.element_size()


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def sharegpt_prompts(n: int) -> list[str]:
    """The first `n` first questions of ShareGPT's held-out conversations of 50 to 2,000
    characters."""
    prompts = []
    for c in conversations(fetch_data("sharegpt")):
        if held_out(c) and c.turns and c.turns[0][0] == "human" \
                and 50 <= len(c.turns[0][1]) <= 2000:
            prompts.append(c.turns[0][1])
            if len(prompts) == n:
                break
    return prompts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--methods", default="ar,auto,suffix,recycling,pld,hf,hf-pld")
    p.add_argument("--settings", default="greedy,t07")
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--sharegpt", action="store_true", help="prompts from ShareGPT's held-out "
                   "conversations")
    p.add_argument("--repeats", type=int, default=1, help="runs per method (median reported)")
    p.add_argument("--draft-model", help="draft model (methods draft, triforce)")
    p.add_argument("--heads", help="a trained drafter's directory, for the methods named "
                   "with @heads")
    p.add_argument("--out", default="chat_bench.json")
    args = p.parse_args()
    model = longspec.load_model(args.model, dtype=args.dtype, device=args.device)
    draft = None if args.draft_model is None else longspec.load_model(
        args.draft_model, dtype=args.dtype, device=args.device)
    print(model.profile, flush=True)
    step_bytes = weight_bytes(model.net)
    print(f"weights read per plain step: {step_bytes / 1e6:.1f} MB", flush=True)
    methods = split_entries(args.methods)
    for m in [m for m in methods if m in PEERS]:
        status = peer_status(m, model, SETTINGS["greedy"], 0, False)
        if status != "ok":
            print(f"{m}: {status}")
            methods.remove(m)
    wanted = {m for m in methods if m in PEERS}
    peers = Peers(model, None, wanted) if wanted else None
    rows = []
    for setting in args.settings.split(","):
        sampling = SETTINGS[setting]
        prompts = sharegpt_prompts(args.prompts) if args.sharegpt else PROMPTS[:args.prompts]
        for k, text in enumerate(prompts):
            ids = encode_prompt(model, [{"role": "user", "content": text}])
            run_one(model, draft, peers, "ar", ids, 16, sampling)               # warm-up
            runs = {m: [] for m in methods}
            for _ in range(args.repeats):           # interleaved, so drift hits all alike
                for m in methods:
                    runs[m].append(run_one(model, draft, peers, m, ids, args.new_tokens,
                                           sampling, args.heads))
            results = {m: median_run(r) for m, r in runs.items()}
            ref = results["ar"]
            # where the answer ends: the tokens after it continue past end-of-turn
            first_eos = answer_end(ref["tokens"], model.eos_token_ids)
            for m, r in results.items():
                row = {"setting": setting, "prompt": k, "method": m,
                       "tok_s": round(r["tok_s"], 2),
                       "vs_ar": round(r["tok_s"] / ref["tok_s"], 3),
                       "identical": (all(run["tokens"] == ref["tokens"] for run in runs[m])
                                     if m not in PEERS else None),
                       "first_eos": first_eos,
                       "distinct_4": round(distinct_n(r["tokens"], 4), 3),
                       "loop": is_loop(r["tokens"]),
                       **{key: r[key] for key in ("len", "nodes", "sizing_s", "sources",
                                                  "verify_ms", "other_ms") if key in r}}
                if m == "ar":
                    row["weights_gb_s"] = round(step_bytes * r["tok_s"] / 1e9, 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for setting in args.settings.split(","):
        for m in methods:
            mine = [r for r in rows if r["setting"] == setting and r["method"] == m]
            text = [r for r in mine if not r["loop"]]     # loops left out of the means
            summary[f"{setting}/{m}"] = {
                "loops_left_out": len(mine) - len(text),
                "geomean_vs_ar": round(geomean([r["vs_ar"] for r in text]), 3),
                "min_vs_ar": min((r["vs_ar"] for r in text), default=None),
                "mean_tok_s": round(sum(r["tok_s"] for r in mine) / len(mine), 2),
                "all_identical": all(r["identical"] in (True, None) for r in mine)}
            print(f"{setting:7s} {m:12s} {json.dumps(summary[f'{setting}/{m}'])}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "draft_model": args.draft_model, "heads": args.heads,
                   "kernel_profile": model.profile.as_dict(), "dtype": str(model.dtype),
                   "new_tokens": args.new_tokens, "weight_bytes_per_step": step_bytes,
                   "threads": torch.get_num_threads(), "rows": rows, "summary": summary}, f,
                  indent=1)


if __name__ == "__main__":
    main()
