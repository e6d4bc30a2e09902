"""The int4 products side by side at a model's shapes: whether a change to int4_mm pays.

The int4 products side by side at a model's shapes: longspec::int4_mm (int4_mm.cpp, CPUs with
AVX2), PyTorch's int4 kernel (`_weight_int4pack_mm_for_cpu`, what runs without the compiled
kernels) and, for reference, the dense bfloat16 product, for 1 to 16 rows (a plain step, and
draft trees' verification). Prints milliseconds, the weight bandwidth achieved (bytes of each
kernel's operands over its time) and each kernel's error against the float64 product.

    python benchmarks/int4_bench.py --shapes smollm2
    python benchmarks/int4_bench.py --shapes qwen-1.5b
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

from longspec.models.compiled import int4_mm
from longspec.models.linear import pack_int4_mm

# (out, in) of each layer's products (q|k|v, output, gate|up, down), then the LM head (SmolLM2's
# is Q8_0: two 4-bit halves, so twice this one)
SHAPES = {"smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
          "qwen-1.5b": [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]}
# a plain step, and draft trees or batches (int4_mm: 1-8 rows each in one pass over the codes;
# 13: two passes; 16: one with AVX2's blocks of 16, two with AVX-512)
ROWS = (1, 2, 4, 5, 6, 7, 8, 13, 16)


def timed(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    if not int4_mm():
        raise SystemExit("longspec::int4_mm does not run here (no AVX2 build, or AMX tiles)")
    print(f"cpu {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    g = torch.Generator().manual_seed(0)
    for out, k in SHAPES[args.shapes]:
        codes = torch.randint(0, 16, (out, k), generator=g)
        scales = (torch.rand(out, k // 32, generator=g) * 0.02).half().float()
        mins = (-torch.rand(out, k // 32, generator=g) * 0.1).half().float()
        w = (codes.double().view(out, -1, 32) * scales.double()[..., None]
             + mins.double()[..., None]).view(out, k)
        packed, scale_min = pack_int4_mm(codes, scales, mins)
        aten = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        scale_zero = torch.stack([scales.t(), (mins + 8 * scales).t()], -1).bfloat16()
        dense = w.bfloat16()
        kernels = {
            "int4_mm": (functools.partial(torch.ops.longspec.int4_mm, codes=packed,
                                          scale_min=scale_min), packed.nbytes + scale_min.nbytes),
            "aten_int4": (functools.partial(torch.ops.aten._weight_int4pack_mm_for_cpu,
                                            mat2=aten, qGroupSize=32, qScaleAndZeros=scale_zero),
                          aten.nbytes + scale_zero.nbytes),
            "bf16_dense": (functools.partial(torch.nn.functional.linear, weight=dense),
                           dense.nbytes)}
        x_all = torch.randn(max(ROWS), k, generator=g).bfloat16()
        exact = x_all.double() @ w.t()
        for name, (fn, nbytes) in kernels.items():
            error = ((fn(x_all).double() - exact).abs().max() / exact.abs().max()).item()
            for rows in ROWS:
                x = x_all[:rows].contiguous()
                seconds = timed(functools.partial(fn, x), args.reps)
                print(json.dumps({"shape": [out, k], "kernel": name, "rows": rows,
                                  "ms": round(seconds * 1e3, 4),
                                  "gb_s": round(nbytes / seconds / 1e9, 2),
                                  "rel_error": float(f"{error:.2e}")}), flush=True)


if __name__ == "__main__":
    main()
