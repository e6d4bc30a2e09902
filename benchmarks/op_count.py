"""How many framework operations a decoding step issues: the count behind "a CUDA step is
launch-bound" (every operation but the views is a kernel launch there, ~9 us each on an H100).

Runs a method for one new token and for --tokens new tokens under a TorchDispatchMode that counts
every ATen operation dispatched; the difference, over the steps between them, is a step's count
(the prefill left out), printed with the ten most frequent operations. The Python layers are what
CUDA runs, so the count is taken with them on a CPU too (LONGSPEC_NATIVE=0 is set here before
longspec loads; on a CPU with the compiled layers a step is a handful of operator calls instead).

    python benchmarks/op_count.py --model smollm2 --methods ar,auto --tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

os.environ.setdefault("LONGSPEC_NATIVE", "0")

from torch.utils._python_dispatch import TorchDispatchMode

import longspec


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    model = longspec.load_model(args.model, device=args.device, dtype=args.dtype,
                                dequantize=args.model.endswith(".gguf") or args.model == "smollm2")
    print(model.profile, flush=True)
    prompt = "Write a long story about a lighthouse keeper."
    for method in args.methods.split(","):
        model.state.clear()
        longspec.generate(model, prompt, max_new_tokens=8, method=method, seed=0)   # warm-up
        counts, stats = [], []
        for n in (1, args.tokens):       # the prefill and the first step, then more steps
            model.state.clear()
            with CountOps() as counter:
                res = longspec.generate(model, prompt, max_new_tokens=n, method=method, seed=0,
                                        ignore_eos=True)
            counts.append(counter.ops)
            stats.append(res.stats)
        steps = stats[1]["steps"] - stats[0]["steps"]
        per_step = counts[1] - counts[0]
        print(json.dumps({"method": method, "steps": steps,
                          "new_tokens": stats[1]["new_tokens"] - stats[0]["new_tokens"],
                          "operations_a_step": round(sum(per_step.values()) / steps),
                          "most_frequent_a_step": [(op, round(c / steps, 1))
                                                   for op, c in per_step.most_common(10)]}),
              flush=True)


if __name__ == "__main__":
    main()
