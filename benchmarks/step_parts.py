"""Where a forward of q rows goes: the part to make faster for steps of n rows and prefill.

Where a forward of q rows goes: the whole forward against its parts timed alone on the same
shapes (every layer's four products, every layer's attention over the cache, the LM head over
every row), the rest by difference; it decides which part a step of n rows or a prefill chunk
should have made faster. Medians; a random cache of `context` positions.

    python benchmarks/step_parts.py --model qwen-coder-1.5b --at 2048:1,2048:8,8192:8,1536:512
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from ar_latency import random_cache

import longspec
from longspec.cache import causal_mask


def median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times)


def forward_inputs(model, context: int, q: int) -> tuple:
    """A forward of q rows over a random cache of `context` positions: tokens, positions, the
    cache and the block's causal mask."""
    cache = random_cache(model, context, q + 8)
    tokens = torch.randint(0, model.config.vocab_size, (q,))
    positions = torch.arange(context, context + q)
    mask = causal_mask(q, model.dtype, model.device) if q > 1 else None
    return tokens, positions, cache, mask


def parts(model, context: int, q: int, repeats: int, ops: int = 0) -> dict:
    net, c = model.net, model.config
    tokens, positions, cache, mask = forward_inputs(model, context, q)
    hidden = torch.randn(q, c.hidden_size, dtype=model.dtype)
    inner = torch.randn(q, c.intermediate_size, dtype=model.dtype)
    queries = torch.randn(q, c.num_heads, c.head_dim, dtype=model.dtype)
    keys, values = cache.k[0][:, :context + q], cache.v[0][:, :context + q]
    if net.attention != "loops":
        raise ValueError(f"attention runs as {net.attention}: this script times the loops")
    attention = torch.ops.longspec.attention
    row = {
        "context": context, "rows": q,
        "whole_ms": median_ms(lambda: net(tokens, positions, cache, mask).logits.argmax(-1)
                              .tolist(), repeats),
        "products_ms": median_ms(lambda: [(b.wqkv(hidden), b.wo(hidden), b.w_gate_up(hidden),
                                           b.w_down(inner)) for b in net.layers], repeats),
        "attention_ms": median_ms(lambda: [attention(queries, keys, values, context, mask, None,
                                                     c.head_dim ** -0.5)
                                           for _ in range(c.num_layers)], repeats),
        "lm_head_ms": median_ms(lambda: net.lm_head(hidden), repeats)}
    row["rest_ms"] = row["whole_ms"] - row["products_ms"] - row["attention_ms"] - row[
        "lm_head_ms"]
    if ops:
        row["ops_ms"] = op_times(lambda: net(tokens, positions, cache, mask).logits.argmax(-1)
                                 .tolist(), repeats, ops)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def op_times(run, repeats: int, top: int) -> dict:
    """The `top` framework calls of a run by their own time, ms a run (mean of `repeats`)."""
    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return {e.key: round(e.self_cpu_time_total / 1e3 / repeats, 2) for e in events[:top]}


def alternate(model, shapes: list[tuple[int, int]], rounds: int) -> list[dict]:
    """Whole forwards of every (context, rows) in turn, `rounds` times: medians, ms, and each
    over the median of the first shape with its context."""
    inputs = [forward_inputs(model, context, q) for context, q in shapes]
    for each in inputs:
        model.net(*each)
    times: list[list[float]] = [[] for _ in inputs]
    for _ in range(rounds):
        for each, spent in zip(inputs, times):
            begin = time.perf_counter()
            model.net(*each).logits.argmax(-1).tolist()
            spent.append(1e3 * (time.perf_counter() - begin))
    medians = [statistics.median(t) for t in times]
    first = {}
    for (context, _), m in zip(shapes, medians):
        first.setdefault(context, m)
    return [{"context": context, "rows": q, "whole_ms": round(m, 1),
             "fastest_ms": round(min(t), 1), "over_first": round(m / first[context], 2)}
            for (context, q), m, t in zip(shapes, medians, times)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--at", default="2048:1,2048:8,2048:16,8192:1,8192:8,8192:16,1536:512",
                   help="comma-separated context:rows")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ops", type=int, default=0,
                   help="also the whole forward's N costliest framework calls")
    p.add_argument("--alternate", type=int, default=0, metavar="N",
                   help="only whole forwards, every shape in turn for N rounds")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    print(f"kernel profile: {model.profile.describe()}", flush=True)
    shapes = [tuple(int(x) for x in spec.split(":")) for spec in args.at.split(",")]
    if args.alternate:
        for row in alternate(model, shapes, args.alternate):
            print(json.dumps(row), flush=True)
        return
    for context, q in shapes:
        print(json.dumps(parts(model, context, q, args.repeats if q < 100 else 1, args.ops)),
              flush=True)


if __name__ == "__main__":
    main()
