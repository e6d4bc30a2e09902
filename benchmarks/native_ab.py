"""The compiled decoder layers (models/native.cpp) against the Python ones, in one process.

One forward of a plain step (1 node) and of an 8-node draft tree over the same cache, in
interleaved rounds (only side-by-side ratios mean anything): the Python layers with attention
as attention.py's products, the Python layers with attention as longspec::attention (the
loops), and the compiled layers (the logits checked equal to the Python loops').

    python benchmarks/native_ab.py --model smollm2 --contexts 300,1024,4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from ar_latency import prefilled_cache, random_cache

import longspec
from longspec.tree import TreeShape

TREE = [-1, 0, 0, 1, 1, 2, 3, 4]


def median_ms(net, block: tuple, reps: int) -> float:
    """Median ms of `reps` forwards of `block` (after two unmeasured ones)."""
    times = []
    for i in range(reps + 2):
        start = time.perf_counter()
        net(*block)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compiled_model(name: str):
    """The model `name` loaded on the CPU, refused unless its layers run compiled."""
    model = longspec.load_model(name, device="cpu")
    if model.net.native is None:
        raise SystemExit(f"{name} has no compiled layers (not a quantized CPU model, or no "
                         "compiler; see README)")
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--contexts", default="300,1024,4096")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--random-cache", action="store_true",
                    help="fill the cache with random keys and values instead of a prefill")
    args = ap.parse_args()
    model = compiled_model(args.model)
    net, native = model.net, model.net.native
    cpu = torch.device("cpu")
    print("context nodes products_ms loops_ms compiled_ms loops/products compiled/loops")
    variants = {"products": (None, "products"), "loops": (None, "loops"),
                "compiled": (native, "loops")}
    for context in map(int, args.contexts.split(",")):
        cache = (random_cache if args.random_cache else prefilled_cache)(model, context, 16)
        for shape in (TreeShape([-1], cpu), TreeShape(TREE, cpu)):
            q = len(shape.depth)
            tokens = torch.randint(0, model.config.vocab_size, (q,))
            mask = shape.mask(model.dtype) if q > 1 else None
            block = (tokens, shape.depth + context, cache, mask)
            times = {name: [] for name in variants}
            logits = {}
            for _ in range(args.rounds):
                for name, (layers, attention) in variants.items():
                    net.native, net.attention = layers, attention
                    logits[name] = net(*block).logits
                    times[name].append(median_ms(net, block, args.reps))
            net.native = native
            assert torch.equal(logits["loops"], logits["compiled"])
            ms = {name: statistics.median(runs) for name, runs in times.items()}
            ratio = {name: statistics.median(a / b for a, b in zip(times[name], times[base]))
                     for name, base in (("loops", "products"), ("compiled", "loops"))}
            print(f"{context} {q} {ms['products']:.2f} {ms['loops']:.2f} {ms['compiled']:.2f} "
                  f"{ratio['loops']:.3f} {ratio['compiled']:.3f}", flush=True)

if __name__ == "__main__":
    main()
