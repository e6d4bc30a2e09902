"""The first token of plain decoding: its step taken from the prefill's last row, against a
step of its own.

The first token of plain decoding: its step taken from the prefill's last row (the engine's
way, Engine._first_step_in_prefill) against a step of its own after a prefill of all but the
last token (as the engine did before; here by switching the engine's choice off), alternated in
one process, medians of `--repeats`: a prompt of `--new` tokens with nothing cached, and a
chat's next turn (`--prefix` tokens from the prompt cache, then `--new` tokens). The tokens are
the same either way (tests/test_lossless.py).

    python benchmarks/first_token.py --model qwen-coder-1.5b --prefix 3500 --new 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import longspec
from longspec.bench.prompts import default_prompt_text
from longspec.engine.generation import Engine
from longspec.request import encode_prompt


def first_token_s(model, prompt: list[int]) -> float:
    begin = time.perf_counter()
    stream = longspec.stream(model, prompt, method="ar", max_new_tokens=2, ignore_eos=True)
    next(iter(stream))
    seconds = time.perf_counter() - begin
    stream.close()
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--prefix", type=int, default=3500, help="tokens a next turn has cached "
                   "(0: no next turn)")
    p.add_argument("--new", type=int, default=40, help="tokens of a prompt not cached")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    model = longspec.load_model(args.model)
    print(f"kernel profile: {model.profile.describe()}", flush=True)
    text = encode_prompt(model, default_prompt_text())
    if len(text) < args.prefix + args.repeats * args.new + args.new:
        raise SystemExit(f"the prompt text has {len(text)} tokens: lower --prefix or --new")
    folded = Engine._first_step_in_prefill
    times: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.repeats):
        fresh = text[r * args.new:(r + 1) * args.new]
        turn = text[:args.prefix] + text[args.prefix + r * args.new:args.prefix + (r + 1) *
                                         args.new]
        for case, prompt in (("fresh", fresh), ("next turn", turn))[:1 + (args.prefix > 0)]:
            for fold in (True, False)[::1 - 2 * (r % 2)]:     # each first in turn
                Engine._first_step_in_prefill = folded if fold else (lambda self: False)
                model.state.prompt_cache.clear()
                if case == "next turn":     # the turn before, its prompt cached
                    longspec.generate(model, text[:args.prefix], method="ar", max_new_tokens=1)
                times.setdefault((case, fold), []).append(first_token_s(model, prompt))
    Engine._first_step_in_prefill = folded
    for (case, fold), seconds in times.items():
        print(json.dumps({"case": case, "prompt_tokens": args.new + (case != "fresh") *
                          args.prefix, "cached": (case != "fresh") * args.prefix,
                          "first_step": "in the prefill" if fold else "its own",
                          "median_ms": round(1e3 * statistics.median(seconds), 1),
                          "ms": [round(1e3 * s) for s in seconds]}))


if __name__ == "__main__":
    main()
