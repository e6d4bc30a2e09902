"""Structured outputs at length: a JSON document under a schema, `ar` against `auto`.

Structured outputs at length: the model extracts records from a text in its prompt into one
JSON document under a nested schema (greedy, end-of-sequence respected), decoded by `ar` and by
`auto` under the same grammar in one process, in rounds whose order turns: tokens a second over
the decode, the ratio, tokens a step, the forced tokens, where the answer ended, its distinct-4,
whether `auto` wrote `ar`'s tokens and whether the document validates. `--llama-cpp` decodes
the same chat under the same schema with llama.cpp instead (its own process; llama-cpp-python's
schema-to-grammar and sampler; tokens a second over the decode, its prompt read by a first call
of one token). `--grammar-cost` times the grammar's own work a committed token (masks, forced
tokens, consuming) in `ar` against a plain step of the model without a grammar.

    python benchmarks/structured.py --model qwen-coder-1.5b
    python benchmarks/structured.py --model qwen-coder-1.5b --llama-cpp
    python benchmarks/structured.py --model smollm2 --grammar-cost
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import sys
import time

import torch

import longspec
from longspec.bench.metrics import distinct_n

# the standard library's modules whose functions the text describes (a text of 14 records)
MODULES = ("bisect", "heapq", "colorsys", "fnmatch", "textwrap", "shlex", "glob", "copy",
           "difflib", "filecmp", "base64", "html", "statistics", "string")

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["modules"],
    "properties": {"modules": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "required": ["name", "summary", "functions"],
        "properties": {
            "name": {"type": "string"},
            "summary": {"type": "string"},
            "functions": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "args"],
                "properties": {"name": {"type": "string"},
                               "args": {"type": "array", "items": {"type": "string"}}}}}}}}}}


def records_text() -> str:
    """A text of records: each module's first docstring line and its public functions'
    signatures, as prose."""
    parts = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        doc = (inspect.getdoc(module) or "").strip().splitlines()
        functions = []
        for attr, value in sorted(vars(module).items()):
            if attr.startswith("_") or not inspect.isfunction(value):
                continue
            try:     # without the addresses in defaults' reprs: the same text each run
                functions.append(re.sub(r" at 0x[0-9a-f]+", "",
                                        f"{attr}{inspect.signature(value)}"))
            except (TypeError, ValueError):
                continue
        if doc and functions:
            parts.append(f"The module {name}: {doc[0]} It defines "
                         + "; ".join(functions[:6]) + ".")
    return "\n".join(parts)


def messages() -> list[dict]:
    return [{"role": "user", "content": (
        "Extract every module in this text into JSON: for each one its name, its summary, and "
        "its functions with the names of their arguments.\n\n" + records_text())}]


def describe(res, ids: list[int]) -> dict:
    s = res.stats
    try:
        doc = json.loads(res.text)
        valid = isinstance(doc, dict) and isinstance(doc.get("modules"), list)
    except json.JSONDecodeError:
        valid = False
    return {"tok_s": round(s["tokens_per_s"], 2), "new_tokens": s["new_tokens"],
            "steps": s["steps"], "tokens_a_step": round(s["mean_accepted_length"], 2),
            "forced": s["forced_tokens"], "forced_accepted": s["accepted_forced_tokens"],
            "prefill_s": round(s["prefill_s"], 2),
            "ended": f"{s['new_tokens']} ({res.finish_reason})",
            "distinct_4": round(distinct_n(ids, 4), 3), "valid": valid,
            "start": res.text[:120]}


def longspec_side(model, args) -> dict:
    """`ar` and `auto` in rounds, the order turned each round (ar, auto; auto, ar; ...), so
    that the machine's drift over minutes (this VM's plain step moved 51-66 ms between runs)
    falls on both sides: each round's rows and ratio, and the ratio of the rounds' summed
    decode times."""
    settings = {"max_new_tokens": args.max_new_tokens, "json_schema": SCHEMA, "seed": 0,
                "sampling": longspec.SamplingConfig(temperature=0)}
    rounds, ids, seconds = [], {}, {"ar": 0.0, "auto": 0.0}
    for r in range(args.rounds):
        row = {}
        for method in ("ar", "auto") if r % 2 == 0 else ("auto", "ar"):
            model.state.forget_text()              # no earlier output, no cached prompt
            res = longspec.generate(model, messages(), method=method, **settings)
            row[method] = describe(res, res.token_ids)
            ids.setdefault(method, res.token_ids)
            seconds[method] += res.stats["decode_s"]
        row["auto_over_ar"] = round(row["auto"]["tok_s"] / row["ar"]["tok_s"], 2)
        rounds.append(row)
        print(json.dumps({"round": r, **row}), file=sys.stderr, flush=True)
    return {"side": "longspec", "profile": model.profile.describe(), "rounds": rounds,
            "auto_over_ar": round(seconds["ar"] / seconds["auto"], 2),
            "identical": ids["ar"] == ids["auto"]}


def llama_cpp_side(model, args) -> dict:
    from llama_cpp import Llama

    llm = Llama(str(model.path), n_ctx=8192, n_threads=torch.get_num_threads(), verbose=False)
    fmt = {"type": "json_object", "schema": SCHEMA}
    begin = time.perf_counter()
    llm.create_chat_completion(messages(), max_tokens=1, temperature=0, response_format=fmt)
    prefill_s = time.perf_counter() - begin          # the prompt, kept for the next call
    begin = time.perf_counter()
    out = llm.create_chat_completion(messages(), max_tokens=args.max_new_tokens, temperature=0,
                                     response_format=fmt)
    seconds = time.perf_counter() - begin
    text = out["choices"][0]["message"]["content"]
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    n = out["usage"]["completion_tokens"]
    try:
        valid = isinstance(json.loads(text).get("modules"), list)
    except (json.JSONDecodeError, AttributeError):
        valid = False
    return {"side": "llama.cpp", "tok_s": round(n / seconds, 2), "new_tokens": n,
            "prefill_s": round(prefill_s, 2), "finish_reason": out["choices"][0]["finish_reason"],
            "distinct_4": round(distinct_n(ids, 4), 3), "valid": valid, "start": text[:120]}


def grammar_cost(model, args) -> dict:
    """Seconds of the grammar's work a committed token in `ar` (GrammarState's calls) against
    `ar`'s plain step without a grammar, on the same chat."""
    from longspec.outputs import grammar

    spent = [0.0]

    def timed(fn):
        def run(*a, **k):
            begin = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - begin
        return run

    settings = {"max_new_tokens": args.max_new_tokens, "seed": 0, "method": "ar",
                "sampling": longspec.SamplingConfig(temperature=0)}
    plain = longspec.generate(model, messages(), **settings).stats
    for name in ("tree_masks", "forced", "commit"):
        setattr(grammar.GrammarState, name, timed(getattr(grammar.GrammarState, name)))
    held = longspec.generate(model, messages(), json_schema=SCHEMA, **settings).stats
    step = plain["decode_s"] / plain["steps"]
    per_token = spent[0] / held["new_tokens"]
    return {"side": "grammar cost", "profile": model.profile.describe(),
            "plain_step_ms": round(step * 1e3, 3), "grammar_ms_a_token": round(per_token * 1e3, 3),
            "share_of_a_step": round(per_token / step, 4), "tokens": held["new_tokens"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--max-new-tokens", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of ar and auto, the order turned each round")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--llama-cpp", action="store_true", help="llama.cpp's side instead")
    side.add_argument("--grammar-cost", action="store_true",
                      help="the grammar's work a token against a plain step")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    run = (llama_cpp_side if args.llama_cpp else grammar_cost if args.grammar_cost
           else longspec_side)
    print(json.dumps({"model": args.model, **run(model, args)}), flush=True)


if __name__ == "__main__":
    main()
