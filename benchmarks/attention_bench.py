"""longspec::attention timed alone at a model's shapes: whether a change to the loops pays.

longspec::attention (the attention loops of native.cpp) alone, at a model's head shapes: one
query token (a plain step) and an 8-token chain (a draft tree's verification) over a cache of
n random keys and values. Prints the fastest of three means of `--reps` calls, and a digest of
the output (the same digest on two builds: the same bits).

With --layers L, each call is a pass over L caches of their own, as a forward's layers are:
past a few thousand positions they no longer fit in the CPU's caches, so the pass reads them
from memory (the GB/s column: keys and values read per second), where one cache called again
stays in the last-level cache.

    python benchmarks/attention_bench.py --contexts 2048,8192,32768
    python benchmarks/attention_bench.py --shapes qwen-1.5b --contexts 8192,32768 --layers 28
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time

import torch

from longspec.models.compiled import extension

# (query heads, key/value heads, head dim)
SHAPES = {"smollm2": (9, 3, 64), "qwen-1.5b": (12, 2, 128)}


def attend(q, caches, start: int, mask, scale: float) -> torch.Tensor:
    """longspec::attention of q over each cache in turn; the last output."""
    for keys, values in caches:
        out = torch.ops.longspec.attention(q, keys, values, start, mask, None, scale)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="smollm2,qwen-1.5b")
    p.add_argument("--contexts", default="2048,8192")
    p.add_argument("--rows", default="1,8")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--layers", type=int, default=1, help="caches a call passes over")
    args = p.parse_args()
    if extension() is None:
        raise SystemExit("the compiled kernels do not run here")
    print(f"cpu {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    g = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        heads, kv_heads, d = SHAPES[shape]
        for n in map(int, args.contexts.split(",")):
            caches = [(torch.randn(kv_heads, n, d, generator=g).bfloat16(),
                       torch.randn(kv_heads, n, d, generator=g).bfloat16())
                      for _ in range(args.layers)]
            for rows in map(int, args.rows.split(",")):
                q = torch.randn(rows, heads, d, generator=g).bfloat16()
                mask = (torch.full((rows, rows), float("-inf")).triu(1).bfloat16()
                        if rows > 1 else None)

                call = functools.partial(attend, q, caches, n - rows, mask, d ** -0.5)
                out = call()
                best = float("inf")
                for _ in range(3):
                    start = time.perf_counter()
                    for _ in range(args.reps):
                        call()
                    best = min(best, (time.perf_counter() - start) / args.reps)
                digest = hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest()
                read = 2 * kv_heads * n * d * 2 * args.layers
                print(json.dumps({"shape": shape, "context": n, "rows": rows,
                                  "layers": args.layers, "ms": round(best * 1e3, 3),
                                  "GB/s": round(read / best / 1e9, 1), "digest": digest[:12]}),
                      flush=True)


if __name__ == "__main__":
    main()
