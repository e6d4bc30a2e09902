"""Whether longspec's load of a GGUF file agrees with llama.cpp's: perplexity, greedy tokens.

How close longspec's load of a GGUF file is to llama.cpp's on the same file: perplexity over a
held text (the same token ids fed to both, one causal forward each) and the greedy tokens of
chat prompts, with where each prompt's tokens first part. Bits differ between engines (other
kernels, other rounding), so the two agree closely, not exactly.

    python benchmarks/gguf_fidelity.py --model qwen-coder-1.5b --tokens 1024 --new-tokens 48

The held text is the source of Python's own `argparse` module (present wherever Python is, not
written by the model); --text takes another file.
"""

from __future__ import annotations

import argparse
import argparse as held_module
import json
import math
import time

import numpy as np
import torch

import longspec
from longspec.cache.base import causal_mask
from longspec.cache.full import StaticCache
from longspec.request import encode_prompt

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain what a hash map is and how collisions are handled.",
    "Write a C function that reverses a singly linked list.",
    "What does the SQL GROUP BY clause do? Give an example.",
]


def nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] under the logits of the positions before them."""
    x = torch.from_numpy(logits[:-1]).double()
    logp = torch.log_softmax(x, -1)
    return float(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())


def longspec_logits(model, ids: list[int]) -> np.ndarray:
    cache = StaticCache(model.config, len(ids), model.dtype, "cpu")
    with torch.no_grad():
        out = model.net(torch.tensor(ids), torch.arange(len(ids)), cache,
                        causal_mask(len(ids), model.dtype, "cpu"))
    return out.logits.float().numpy()


def llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen-coder-1.5b")
    ap.add_argument("--text", help="held text file (default: Python's argparse.py)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the held text scored")
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="gguf_fidelity.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama

    model = longspec.load_model(args.model)
    print(model.profile)
    llm = Llama(model_path=str(model.path), n_ctx=max(args.tokens, 1024) + 64, logits_all=True,
                n_threads=args.threads, verbose=False)
    path = args.text or held_module.__file__
    with open(path, encoding="utf-8") as f:
        ids = model.tokenizer(f.read())["input_ids"][:args.tokens]

    begin = time.perf_counter()
    ours = nll(longspec_logits(model, ids), ids)
    ours_s = time.perf_counter() - begin
    begin = time.perf_counter()
    peer = nll(llama_logits(llm, ids), ids)
    peer_s = time.perf_counter() - begin
    result = {"model": args.model, "kernel_profile": model.profile.as_dict(), "text": path,
              "tokens": len(ids), "ppl_longspec": math.exp(ours), "ppl_llamacpp": math.exp(peer),
              "ppl_ratio": math.exp(ours - peer), "seconds": [ours_s, peer_s], "prompts": []}
    print(f"perplexity over {len(ids)} tokens of {path}: longspec {math.exp(ours):.4f} "
          f"({ours_s:.1f} s), llama.cpp {math.exp(peer):.4f} ({peer_s:.1f} s), ratio "
          f"{result['ppl_ratio']:.4f}")

    greedy = longspec.SamplingConfig(temperature=0)
    for text in PROMPTS:
        prompt = encode_prompt(model, [{"role": "user", "content": text}])
        a = longspec.generate(model, prompt, max_new_tokens=args.new_tokens, sampling=greedy,
                              ignore_eos=True).token_ids
        llm.reset()
        b = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            b.append(token)
            if len(b) == args.new_tokens:
                break
        at = first_difference(a, b)
        result["prompts"].append({"prompt": text, "first_difference": at, "longspec": a,
                                  "llamacpp": b})
        print(f"{text[:50]!r}: " + (f"identical for all {len(a)} tokens" if at is None else
                                   f"first differ at token {at}: "
                                   f"{model.tokenizer.decode(a[:at])!r}"))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
