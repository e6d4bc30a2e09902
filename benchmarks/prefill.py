"""Prefill speed in tokens a second, longspec against llama.cpp on the same GGUF and token ids.

Prefill speed: the time to read a prompt of n tokens into an empty cache (tokens a second),
longspec's forward in chunks against llama.cpp's on the same GGUF (`--llama-cpp`, its own
process). The prompt is the start of a real text (this project's Python sources, tokenized),
so every length reads the same tokens, and both sides read the same token ids; one untimed
warm-up of 64 tokens, then the best of `--repeats`.

    python benchmarks/prefill.py --model smollm2 --lengths 512,2048,8000
    python benchmarks/prefill.py --model smollm2 --lengths 512,2048,8000 --llama-cpp
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import longspec


def text() -> str:
    """Enough real text for the longest prompt: longspec's own sources, concatenated."""
    root = Path(longspec.__file__).parent
    return "\n\n".join(p.read_text() for p in sorted(root.rglob("*.py")))


def rates(run, lengths: list[int], repeats: int) -> dict:
    """Tokens a second of `run(n)` (seconds) for each length, best of `repeats`, after a
    warm-up of 64 tokens."""
    run(64)
    return {str(n): round(n / min(run(n) for _ in range(repeats)), 1) for n in lengths}


def longspec_side(model, ids: list[int], lengths: list[int], repeats: int) -> dict:
    from longspec.cache import StaticCache
    from longspec.models.prefill import prefill

    def run(n: int) -> float:
        cache = StaticCache(model.config, n, model.dtype, model.device)
        begin = time.perf_counter()
        prefill(model.net, torch.tensor(ids[:n]), cache, 0, last_logits=1)
        return time.perf_counter() - begin

    return {"side": "longspec", "profile": model.profile.describe(),
            **rates(run, lengths, repeats)}


def llama_cpp_side(model, ids: list[int], lengths: list[int], repeats: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(str(model.path), n_ctx=max(lengths) + 16, n_threads=torch.get_num_threads(),
                n_batch=512, verbose=False)

    def run(n: int) -> float:
        llm.reset()
        begin = time.perf_counter()
        llm.eval(ids[:n])
        return time.perf_counter() - begin

    return {"side": "llama.cpp", **rates(run, lengths, repeats)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--lengths", default="512,2048,8000")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--llama-cpp", action="store_true", help="llama.cpp's side instead")
    args = p.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    model = longspec.load_model(args.model, prompt_cache_mb=0)
    ids = model.tokenizer.encode(text())     # the same tokens for both sides
    if len(ids) < max(lengths):
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {max(lengths)}")
    side = llama_cpp_side if args.llama_cpp else longspec_side
    print(json.dumps({"model": args.model, **side(model, ids, lengths, args.repeats)}),
          flush=True)


if __name__ == "__main__":
    main()
