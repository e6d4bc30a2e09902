"""The results page: what the current code does on this CPU, on text that stays text.

For one model under the kernel profile this process runs with, four workloads, each decoded by
`ar`, `auto` and llama.cpp (plain decoding of the same GGUF file, llama-cpp-python) in one
process, with the models' learned state cleared before every run:

- `chat greedy` and `chat T=0.7` (top-p 0.9): chat_bench's prompts, answers that end where the
  model ends them (end-of-sequence respected, --chat-tokens at most);
- `TokenSwift` (T=1, min-p 0.1, penalty 1.2 over the last 1,024 tokens): --tokenswift-tokens
  tokens, end-of-sequence ignored as in TokenSwift's own runs;
- `code edit`: a standard-library module (--edit-module, colorsys.py by default) returned
  whole with type hints added, greedy, end-of-sequence respected (`--prompts 0` runs it alone).

Every row says where the answer ended (`eos@N`, or `cap` where it ran to the limit) and the
distinct-4 of the tokens timed. A row whose distinct-4 is under DEGENERATE (0.3) is text that
became a loop (which any suffix drafter copies): it is labelled so and left out of the summary.
`ar` and `auto` are timed by their decode time (after the prompt); llama.cpp from its first new
token to its last, over as many tokens as `ar` wrote (end-of-sequence ignored there, so that it
writes that many; at T>0 with its own sampler, so other tokens of the same length).

    python benchmarks/results.py --model smollm2 --out results-smollm2.json
    python benchmarks/results.py --model qwen-coder-1.5b --prompts 1 --out results-qwen.json
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import time

import torch
from chat_bench import PROMPTS
from long_bench import llamacpp

import longspec
from longspec.bench.metrics import answer_end, distinct_n, is_loop
from longspec.bench.peers import Peers, peer_status
from longspec.request import encode_prompt

S = longspec.SamplingConfig
TOKENSWIFT = S(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)


def code_edit_prompt(module: str = "colorsys") -> str:
    return ("Add type hints to every function of this module. Return the whole module, "
            f"nothing else.\n\n```python\n{inspect.getsource(importlib.import_module(module))}```")


def workloads(args) -> list[tuple[str, str, S, int, bool]]:
    """(workload, prompt, sampling, new tokens, end-of-sequence ignored)."""
    chat = PROMPTS[:args.prompts]
    return ([("chat greedy", p, S(temperature=0), args.chat_tokens, False) for p in chat]
            + [("chat T=0.7", p, S(temperature=0.7, top_p=0.9), args.chat_tokens, False)
               for p in chat]
            + [("TokenSwift", p, TOKENSWIFT, args.tokenswift_tokens, True) for p in chat]
            + [("code edit", code_edit_prompt(args.edit_module), S(temperature=0),
                args.edit_tokens, False)])


def ours(model, method: str, ids: list[int], n: int, sampling, ignore_eos: bool) -> dict:
    model.state.clear()
    res = longspec.generate(model, ids, max_new_tokens=n, method=method, sampling=sampling,
                            seed=0, ignore_eos=ignore_eos)
    s = res.stats
    return {"tokens": res.token_ids, "tok_s": s["tokens_per_s"],
            "len": s["mean_accepted_length"]}


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def table(rows: list[dict]) -> str:
    lines = [("| workload | prompt | tokens (ended) | distinct-4 | ar tok/s | auto tok/s | "
             "auto/ar | tokens a step | llama.cpp tok/s | auto/llama.cpp | identical |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        label = " (a loop)" if r["degenerate"] else ""
        cpp = f"{r['llamacpp_tok_s']:.1f}" if r["llamacpp_tok_s"] else "–"
        vs_cpp = f"{r['auto_vs_llamacpp']:.2f}×" if r["llamacpp_tok_s"] else "–"
        lines.append(
            f"| {r['workload']} | {r['prompt']} | {r['tokens']:,} ({r['ended']}) | "
            f"{r['distinct_4']:.2f}{label} | {r['ar_tok_s']:.1f} | {r['auto_tok_s']:.1f} | "
            f"{r['auto_vs_ar']:.2f}× | {r['auto_len']:.2f} | {cpp} | {vs_cpp} | "
            f"{'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> dict:
    """Per workload, the geomeans over the rows whose text stayed text."""
    out = {}
    for w in dict.fromkeys(r["workload"] for r in rows):
        kept = [r for r in rows if r["workload"] == w and not r["degenerate"]]
        cpp = [r["auto_vs_llamacpp"] for r in kept if r["llamacpp_tok_s"]]
        out[w] = {"rows": len(kept), "loops_left_out": sum(r["workload"] == w for r in rows)
                  - len(kept), "auto_vs_ar": round(geomean([r["auto_vs_ar"] for r in kept]), 3),
                  "auto_vs_llamacpp": round(geomean(cpp), 3) if cpp else None,
                  "all_identical": all(r["identical"] for r in rows if r["workload"] == w)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=2, help="chat prompts per chat workload")
    p.add_argument("--chat-tokens", type=int, default=1024)
    p.add_argument("--tokenswift-tokens", type=int, default=2048)
    p.add_argument("--edit-tokens", type=int, default=2048)
    p.add_argument("--edit-module", default="colorsys", help="the standard-library module the "
                   "code edit returns with type hints")
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--out", default="results.json")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    print(model.profile, flush=True)
    status = peer_status("llamacpp", model, S(temperature=0), 0, False)
    peers = None
    if args.no_llamacpp or status != "ok":
        print(f"llama.cpp: {'not asked for' if args.no_llamacpp else status}", flush=True)
    else:
        peers = Peers(model, None, {"llamacpp"})
    warm = encode_prompt(model, [{"role": "user", "content": "Say hello."}])
    ours(model, "ar", warm, 16, S(temperature=0), True)
    rows = []
    for workload, text, sampling, n, ignore_eos in workloads(args):
        ids = encode_prompt(model, [{"role": "user", "content": text}])
        ar = ours(model, "ar", ids, n, sampling, ignore_eos)
        auto = ours(model, "auto", ids, n, sampling, ignore_eos)
        tokens = ar["tokens"]
        eos = answer_end(tokens, model.eos_token_ids)
        ended = (f"eos@{eos}" if eos is not None else "no eos") if ignore_eos else (
            "eos" if len(tokens) < n else "cap")
        cpp = llamacpp(peers, ids, len(tokens), sampling)["tok_s"] if peers else None
        row = {"workload": workload, "prompt": text.split("\n")[0][:40], "tokens": len(tokens),
               "ended": ended, "distinct_4": round(distinct_n(tokens, 4), 3),
               "ar_tok_s": round(ar["tok_s"], 2), "auto_tok_s": round(auto["tok_s"], 2),
               "auto_vs_ar": round(auto["tok_s"] / ar["tok_s"], 3),
               "auto_len": round(auto["len"], 2), "llamacpp_tok_s": cpp and round(cpp, 2),
               "auto_vs_llamacpp": cpp and round(auto["tok_s"] / cpp, 3),
               "identical": auto["tokens"] == tokens}
        row["degenerate"] = is_loop(tokens)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    totals = summary(rows)
    for w, s in totals.items():
        print(f"{w}: {json.dumps(s)}")
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "kernel_profile": model.profile.as_dict(),
                   "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
                   "rows": rows, "summary": totals, "table": table(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
