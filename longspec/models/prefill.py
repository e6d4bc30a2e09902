"""Running many known tokens into a cache: the one prefill loop, for the target's prompt, a
draft model catching up with the sequence, and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

import torch

from ..cache.base import causal_mask
from ..cache.full import StaticCache
from ..step.forward import ForwardOutput
from .transformer import Head, Transformer

# Largest attention score buffer a prefill chunk may build, in bytes.
PREFILL_SCORE_BYTES = 256 * 2**20
# Most tokens a chunk, by device. On a CPU a chunk's activations stay in the cores' caches
# through its products: an 8,000-token prompt of Qwen2.5-Coder-1.5B (int4) took 0.87x the time
# in chunks of 256 as in chunks of 1,024, 0.89x in chunks of 512, on a Zen 3 under AVX2
# (docs/benchmarks/kernels.md, "Prefill in chunks of 256"). A GPU takes more rows a kernel.
MAX_CHUNK = {"cpu": 256, "cuda": 1024}
T = TypeVar("T")


def chunk_size(net: Transformer, n_keys: int, max_chunk: int) -> int:
    """Tokens per chunk, at most `max_chunk`, so that the fp32 score buffer over `n_keys` keys
    stays bounded."""
    per_token = net.config.num_heads * max(n_keys, 1) * 4
    return int(max(16, min(max_chunk, PREFILL_SCORE_BYTES // per_token)))


def prefill(net: Transformer, tokens: list[int] | torch.Tensor, cache: StaticCache,
            first_position: int,
            *, last_logits: int = 0, need_logits: bool = False, return_hidden: bool = False,
            head: Head | None = None,
            on_chunk: Callable[[torch.Tensor, ForwardOutput], None] | None = None
            ) -> torch.Tensor | None:
    """Run `tokens` [n] at positions first_position.. into `cache` and commit them, in causal
    chunks whose attention scores stay under PREFILL_SCORE_BYTES.

    Returns the logits [last_logits, vocab] after the last tokens (None when last_logits is 0),
    by `head` when given (Transformer.hidden_to_logits).
    `on_chunk(chunk tokens, output)` sees every chunk's output, with logits for each of its
    tokens when `need_logits` and hidden states when `return_hidden`.
    """
    return drain(prefilling(net, tokens, cache, first_position, last_logits=last_logits,
                            need_logits=need_logits, return_hidden=return_hidden, head=head,
                            on_chunk=on_chunk))


def prefilling(net: Transformer, tokens: list[int] | torch.Tensor, cache: StaticCache,
               first_position: int,
               *, last_logits: int = 0, need_logits: bool = False, return_hidden: bool = False,
               head: Head | None = None,
               on_chunk: Callable[[torch.Tensor, ForwardOutput], None] | None = None,
               max_chunk: int | None = None) -> Generator[None, None, torch.Tensor | None]:
    """`prefill` a chunk (of at most `max_chunk` tokens; None: the device's MAX_CHUNK) at a
    time: it yields after each chunk (a batch steps its running generations between a joining
    one's chunks) and returns what `prefill` does. The chunks' sizes do not change the cache's
    bits (every row of a forward is what it is alone: the row check)."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=net.device)
    n = ids.shape[0]
    logits = None
    done = 0
    most = max_chunk or MAX_CHUNK[net.device.type]
    while done < n:
        q = min(n - done, chunk_size(net, cache.length + min(n - done, most), most))
        start = first_position + done
        positions = torch.arange(start, start + q, device=net.device)
        last = done + q == n and last_logits > 0
        index = slice(-last_logits, None) if last and not need_logits else None
        out = net(ids[done:done + q], positions, cache,
                  causal_mask(q, net.dtype, net.device) if q > 1 else None,
                  logits_index=index, need_logits=need_logits or last, return_hidden=return_hidden,
                  head=head)
        if on_chunk is not None:
            on_chunk(ids[done:done + q], out)
        if last:
            logits = out.logits[-last_logits:]
        cache.commit(q)
        done += q
        if done < n:
            yield
    return logits


def drain(steps: Generator[None, None, T]) -> T:
    """What a generator of steps returns, once every step has run."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value
