"""longspec::attention (the attention loops of native.cpp) alone, at a model's head shapes: one
query token (a plain step) and an 8-token chain (a draft tree's verification) over a cache of
n random keys and values. Prints the fastest of three means of `--reps` calls, and a digest of
the output (the same digest on two builds: the same bits).

    python benchmarks/attention_bench.py --contexts 2048,8192,32768
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="smollm2,qwen-1.5b")
    p.add_argument("--contexts", default="2048,8192")
    p.add_argument("--rows", default="1,8")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    if extension() is None:
        raise SystemExit("the compiled kernels do not run here")
    print(f"cpu {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    g = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        heads, kv_heads, d = SHAPES[shape]
        for n in map(int, args.contexts.split(",")):
            keys = torch.randn(kv_heads, n, d, generator=g).bfloat16()
            values = torch.randn(kv_heads, n, d, generator=g).bfloat16()
            for rows in map(int, args.rows.split(",")):
                q = torch.randn(rows, heads, d, generator=g).bfloat16()
                mask = (torch.full((rows, rows), float("-inf")).triu(1).bfloat16()
                        if rows > 1 else None)

                call = functools.partial(torch.ops.longspec.attention, q, keys, values,
                                         n - rows, mask, None, d ** -0.5)
                out = call()
                best = float("inf")
                for _ in range(3):
                    start = time.perf_counter()
                    for _ in range(args.reps):
                        call()
                    best = min(best, (time.perf_counter() - start) / args.reps)
                digest = hashlib.sha256(out.view(torch.int16).numpy().tobytes()).hexdigest()
                print(json.dumps({"shape": shape, "context": n, "rows": rows,
                                  "ms": round(best * 1e3, 3), "digest": digest[:12]}), flush=True)


if __name__ == "__main__":
    main()
