"""Plain decoding latency against context length: longspec's `ar` vs transformers' generate.

Milliseconds per new token with the cache already holding `context` tokens, and the memory
bandwidth roofline for the same bytes (weights + KV read per token / measured bandwidth).

    python benchmarks/ar_latency.py --model demo --contexts 2048,8192,32768 \\
        --dtypes float32,bfloat16
    python benchmarks/ar_latency.py --model random-40m --contexts 2048,8192,32768
    python benchmarks/ar_latency.py --model qwen-coder-1.5b --dtypes int4 --no-hf \
        --random-cache --contexts 1024,8192,32000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

import longspec
from longspec.bench.main import weight_bytes
from longspec.bench.metrics import measure_bandwidth, roofline_ms
from longspec.cache import StaticCache
from longspec.models.prefill import prefill


def random_40m(out: str) -> str:
    """A random-weight Llama of ~40M parameters: 8 layers, 8 query / 2 KV heads, vocab 16K."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16384, hidden_size=512, intermediate_size=1536,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=65536)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def prefilled_cache(model, context: int, room: int) -> StaticCache:
    """A cache holding `context` random tokens, with `room` free slots after them."""
    net = model.net
    cache = StaticCache(model.config, context + room, model.dtype, model.device)
    prefill(net, torch.randint(0, model.config.vocab_size, (context,)), cache, 0)
    return cache


def random_cache(model, context: int, room: int) -> StaticCache:
    """A cache holding `context` slots of random keys and values (what they hold does not change
    a step's work; a prefill of 32K positions takes longer than the steps measured after it)."""
    cache = StaticCache(model.config, context + room, model.dtype, model.device)
    g = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    cache.commit(context)
    return cache


def ours_ms(model, context: int, steps: int, random: bool = False) -> float:
    """ms per decode step of the engine's `ar` path with `context` tokens cached (prefilled, or
    random with `random`)."""
    net = model.net
    cache = (random_cache if random else prefilled_cache)(model, context, steps + 2)
    res = []
    token = torch.tensor([1])
    for i in range(steps + 2):
        start = time.perf_counter()
        out = net(token, torch.tensor([context + i]), cache)
        token = out.logits.argmax(-1)
        token.item()
        cache.commit(1)
        res.append(time.perf_counter() - start)
    return 1e3 * sorted(res[2:])[len(res[2:]) // 2]


def hf_ms(model, context: int, steps: int) -> float:
    """ms per new token of transformers' greedy generate after a `context`-token prompt:
    (time for 1 + steps tokens - time for 1 token) / steps, on the same checkpoint (a GGUF
    file dequantized by transformers) in the activations' dtype."""
    from transformers import AutoModelForCausalLM

    where, extra = model.transformers_location
    hf = AutoModelForCausalLM.from_pretrained(where, dtype=model.dtype, **extra).eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, context))

    def timed(n: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                        min_new_tokens=n, do_sample=False, pad_token_id=0)
        return time.perf_counter() - start

    timed(2)
    return 1e3 * (timed(steps + 1) - timed(1)) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo", help="demo, random-40m or a checkpoint directory")
    p.add_argument("--contexts", default="2048,8192,32768")
    p.add_argument("--dtypes", default="float32", help="comma-separated: float32, bfloat16, "
                   "int4 (a quantized GGUF kept quantized; the others dequantize it)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--random-cache", action="store_true",
                   help="fill the cache with random keys and values instead of a prefill")
    args = p.parse_args()
    path = random_40m(tempfile.mkdtemp()) if args.model == "random-40m" else args.model
    bandwidth = measure_bandwidth(torch.device("cpu"))
    rows = []
    for dtype_name in args.dtypes.split(","):
        if dtype_name == "int4":
            model = longspec.load_model(path, device="cpu")
        else:
            model = longspec.load_model(path, dtype=dtype_name, device="cpu", dequantize=True)
        kv = model.config.kv_bytes_per_token(model.dtype.itemsize)
        for context in (int(c) for c in args.contexts.split(",")):
            ours = ours_ms(model, context, args.steps, args.random_cache)
            hf = None if args.no_hf else hf_ms(model, context, args.steps)
            roof = roofline_ms(weight_bytes(model), kv, context, bandwidth)
            row = {"model": args.model, "dtype": dtype_name, "context": context,
                   "ar_ms": round(ours, 2), "hf_ms": round(hf, 2) if hf else None,
                   "roofline_ms": round(roof, 2), "ar_over_roofline": round(ours / roof, 2),
                   "hf_over_ar": round(hf / ours, 2) if hf else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"bandwidth {bandwidth / 1e9:.1f} GB/s, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
