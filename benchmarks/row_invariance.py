"""Which row counts change a product's rows on this device: the row rules a device needs.

Which row counts change a product's rows on this device: for each matrix shape, row i of an
M-row product against the same row run alone, for M up to 256, through `F.linear` as it is and
through longspec's product (`DenseLinear`, with the device's row rules: linear.py). A row count
listed for the raw product is one the rules must avoid; one listed for longspec's breaks
exactness (the load-time row check, selfcheck.py, would catch it at the model's shapes).

    python benchmarks/row_invariance.py --device cuda --dtype float32
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from longspec.models.linear import DenseLinear

# [out, in]: SmolLM2-135M's q|k|v, o, gate|up, down and output matrices, and two of
# Qwen2.5-Coder-1.5B's (its q and down projections)
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576), "q_1.5b": (1536, 1536), "down_1.5b": (1536, 8960)}
ROWS = [*range(1, 65), 80, 96, 128, 160, 192, 256]


def differing(product, x: torch.Tensor) -> list[int]:
    """The row counts M whose product's rows differ from the rows run alone."""
    alone = torch.cat([product(x[i:i + 1]) for i in range(x.shape[0])])
    return [m for m in ROWS if not torch.equal(product(x[:m]), alone[:m])]


def spans(counts: list[int]) -> str:
    """[2, 3, 4, 80] -> '2-4, 80'; [] -> 'none'."""
    runs: list[list[int]] = []
    for m in counts:
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, {args.dtype}")
    g = torch.Generator().manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype)
        x = torch.randn(max(ROWS), k, generator=g).to(device, dtype)
        raw = differing(lambda a, w=w: F.linear(a, w), x)
        ours = differing(DenseLinear(w), x)
        print(f"{shape:>10} {n}x{k}: F.linear differs at {spans(raw)}; longspec at {spans(ours)}",
              flush=True)


if __name__ == "__main__":
    main()
