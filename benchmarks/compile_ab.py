"""The decoder layers three ways, in one process: the compiled C++ layers (native.cpp), the Python
layers as they are (`Block.forward`, eager), and the same Python layers through `torch.compile`
(inductor's CPU backend, dynamic shapes; longspec::attention and longspec::int4_mm opaque
operators inside the graph). One forward of a plain step (1 node) and of an 8-node draft tree
over the same cache; fastest of --rounds interleaved medians of --reps forwards. Also prints how
long each first call took (compilation) and how far torch.compile's output is from the eager
one (other rounding: another kernel profile).

    python benchmarks/compile_ab.py --model smollm2 --contexts 300,2048
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
import torch.nn.functional as F
from ar_latency import prefilled_cache
from native_ab import compiled_model

from longspec.models.attention import block_order
from longspec.tree import TreeShape

TREE = [-1, 0, 0, 1, 1, 2, 3, 4]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--contexts", default="300,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    model = compiled_model(args.model)
    net = model.net

    def layers(x, cos, sin, cache, plan):
        for i, layer in enumerate(net.layers):
            x, _ = layer(x, cos, sin, i, cache, plan, True)
        return x

    ways = {"c++": lambda *a: net.native(*a, False)[0], "eager": layers,
            "torch.compile": torch.compile(layers, dynamic=True)}

    def forward(way, tokens, positions, cache, mask):
        cos, sin = net.rotary(positions)
        plan = dataclasses.replace(cache.plan(len(tokens), mask), block_order=block_order(mask))
        return ways[way](F.embedding(tokens, net.embed), cos, sin, cache, plan)

    def median_ms(way, block) -> float:
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            forward(way, *block)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    cpu = torch.device("cpu")
    print("context nodes " + " ".join(f"{w}_ms" for w in ways)
          + " compile/c++ first_compile_s max|compile-eager|")
    for context in map(int, args.contexts.split(",")):
        cache = prefilled_cache(model, context, 16)
        for shape in (TreeShape([-1], cpu), TreeShape(TREE, cpu)):
            q = len(shape.depth)
            tokens = torch.randint(0, model.config.vocab_size, (q,))
            mask = shape.mask(model.dtype) if q > 1 else None
            block = (tokens, shape.depth + context, cache, mask)
            out, first = {}, {}
            for way in ways:
                start = time.perf_counter()
                out[way] = forward(way, *block)
                first[way] = time.perf_counter() - start
            assert torch.equal(out["c++"], out["eager"])
            apart = (out["torch.compile"].float() - out["eager"].float()).abs().max().item()
            runs = {way: [] for way in ways}
            for _ in range(args.rounds):          # interleaved
                for way in ways:
                    runs[way].append(median_ms(way, block))
            ms = {way: min(times) for way, times in runs.items()}
            print(f"{context} {q} " + " ".join(f"{ms[w]:.2f}" for w in ways)
                  + f" {ms['torch.compile'] / ms['c++']:.2f} {first['torch.compile']:.1f}"
                  + f" {apart:.1f}", flush=True)


if __name__ == "__main__":
    main()
