"""The interface every KV cache offers the model's attention.

A forward over q new tokens asks the cache for a plan: the contiguous slots
[start, start + q) that the new keys and values go to, and the number of key slots to attend to.
Every new token sees every occupied slot outside its own block; inside the block it sees what
the block mask allows (causal for a chain, ancestors for a draft tree). The forward writes and
reads through the cache, but only the engine moves the cache's committed length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

# Attention reduces over keys in chunks of this many slots (models/attention.py); buffers are
# allocated in whole chunks so that reading a chunk's padding stays in bounds.
CHUNK = 256


@dataclass(frozen=True)
class AttentionPlan:
    # first slot of the new block; a device tensor [1] in a captured step (models/graphs.py),
    # whose keys are then every slot and whose rows see what their `layout` says
    start: int | torch.Tensor
    q: int                            # new tokens in the block
    n_keys: int                       # attend to key slots [0, n_keys)
    block_mask: torch.Tensor | None   # additive [q, q] over the block's own slots; None: see all
    block_order: torch.Tensor | None = None   # its rows' visible slots first (attention.py)
    # (tail [q, q], count [q]) int32 for tree_attention.py's kernel (its block_layout)
    layout: tuple[torch.Tensor, torch.Tensor] | None = None


def causal_mask(q: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive [q, q] mask: token i sees tokens 0..i of its block."""
    full = torch.full((q, q), float("-inf"), dtype=dtype, device=device)
    return torch.triu(full, diagonal=1)


def padded(n: int) -> int:
    """n slots rounded up to whole chunks."""
    return -(-n // CHUNK) * CHUNK


def grown(n: int) -> int:
    """n slots rounded up to a power of two of whole chunks."""
    return CHUNK << (-(-n // CHUNK) - 1).bit_length()


class KVCache(ABC):
    """Per-layer key/value buffers [kv_heads, capacity, head_dim].

    Attention reads the padding slots of its last chunk, which must hold finite values (they
    get probability 0). Buffers allocated `zeroed` hold zeros everywhere; otherwise they are
    allocated uninitialized and a plan zeroes the slots its forward reads but does not write
    (`_finite_through`): a fresh buffer's pages cost their first touch, so the slots a
    generation never reaches are never touched. Those buffers get room to grow (a power of
    two of chunks, `grown`), which costs address space alone until a generation reaches it:
    a finished generation's cache, kept (state/kept_caches.py), then holds the next one
    whose context grew (an agent's next turn) on pages already touched."""

    def __init__(self, config, capacity: int, dtype: torch.dtype, device, zeroed: bool = True):
        shape = (config.num_kv_heads, padded(capacity) if zeroed else grown(capacity),
                 config.head_dim)
        make = torch.zeros if zeroed else torch.empty
        self.k = [make(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [make(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.capacity = capacity
        self.finite = shape[1] if zeroed else 0     # slots [0, finite) hold finite values

    def _finite_through(self, end: int) -> None:
        """Before a forward that writes its block up to slot `end` and attends to [0, end):
        zero the slots past `end` that its last chunk reads and that may hold anything."""
        read = padded(end)
        if read > self.finite:
            for buf in (*self.k, *self.v):
                buf[:, max(self.finite, end):read].zero_()
            self.finite = read

    @abstractmethod
    def plan(self, q: int, block_mask: torch.Tensor | None) -> AttentionPlan:
        """Where a block of q new tokens goes and what it attends to."""

    def write(self, layer: int, plan: AttentionPlan, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [kv_heads, q, head_dim] in the plan's block; return the keys and values
        [kv_heads, n_keys, head_dim] to attend to."""
        if isinstance(plan.start, torch.Tensor):
            slots = plan.start + torch.arange(plan.q, device=k.device)
            self.k[layer].index_copy_(1, slots, k)
            self.v[layer].index_copy_(1, slots, v)
            return self.k[layer], self.v[layer]
        end = plan.start + plan.q
        self.k[layer][:, plan.start:end] = k
        self.v[layer][:, plan.start:end] = v
        return self.k[layer][:, :plan.n_keys], self.v[layer][:, :plan.n_keys]


def copy_slots(dst: KVCache, dst_start: int, src: KVCache, src_start: int, n: int) -> None:
    """Copy n slots of every layer's keys and values from `src` to `dst` (which may be the
    same cache: overlapping ranges are read before they are written)."""
    for mine, theirs in zip((*dst.k, *dst.v), (*src.k, *src.v)):
        block = theirs[:, src_start:src_start + n]
        mine[:, dst_start:dst_start + n] = block.clone() if mine is theirs else block
