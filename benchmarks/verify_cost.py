"""Cost of one verify forward of q draft nodes against context length, relative to q = 1.

A speculative step pays one forward over its q tree nodes; it beats plain decoding only when
the accepted length exceeds that forward's cost in plain decoding steps. This prints the cost.

    python benchmarks/verify_cost.py --model demo --contexts 2048,8192,32768 --nodes 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from ar_latency import prefilled_cache

import longspec
from longspec.cache import causal_mask


def forward_ms(model, cache, q: int, reps: int) -> float:
    """Median ms of a forward of q new tokens (a chain: the same work as any q-node tree)."""
    net = model.net
    start_pos = cache.length
    tokens = torch.randint(0, model.config.vocab_size, (q,))
    positions = torch.arange(start_pos, start_pos + q)
    mask = causal_mask(q, model.dtype, model.device)
    times = []
    for _ in range(reps + 2):
        start = time.perf_counter()
        out = net(tokens, positions, cache, mask)
        out.logits.argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times[2:])[reps // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo", help="demo, demo-draft or a checkpoint directory")
    p.add_argument("--contexts", default="2048,8192,32768")
    p.add_argument("--nodes", default="1,2,4,8,16")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, or int4 (a quantized "
                   "GGUF kept quantized)")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    if args.dtype == "int4":
        model = longspec.load_model(args.model, device="cpu")
    else:
        model = longspec.load_model(args.model, dtype=args.dtype, device="cpu", dequantize=True)
    nodes = [int(n) for n in args.nodes.split(",")]
    for context in (int(c) for c in args.contexts.split(",")):
        cache = prefilled_cache(model, context, max(nodes))
        ms = {q: forward_ms(model, cache, q, args.reps) for q in nodes}
        print(json.dumps({"context": context, "ms": {q: round(v, 2) for q, v in ms.items()},
                          "vs_one": {q: round(v / ms[nodes[0]], 2) for q, v in ms.items()}}),
              flush=True)
    print(f"dtype {args.dtype}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
