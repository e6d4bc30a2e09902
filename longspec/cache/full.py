"""The full static KV cache: preallocated, written by position, rolled back by moving an integer."""

from __future__ import annotations

import torch

from ..device.memory import upload
from .base import AttentionPlan, KVCache


class StaticCache(KVCache):
    """Keys and values of every committed token, slot i holding position i.

    `length` counts committed slots. A forward writes its block at [length, length + q); the
    engine then commits (`commit`), keeps a chosen subset (`keep`) or drops it (nothing to do).
    """

    def __init__(self, config, capacity: int, dtype: torch.dtype, device):
        # zeroed where it is cheap (a CUDA memset; captured steps read every slot)
        super().__init__(config, capacity, dtype, device,
                         zeroed=torch.device(device).type != "cpu")
        self.length = 0

    def plan(self, q: int, block_mask: torch.Tensor | None) -> AttentionPlan:
        end = self.length + q
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {self.length} + {q} > capacity {self.capacity}")
        self._finite_through(end)
        return AttentionPlan(self.length, q, end, block_mask)

    def commit(self, n: int) -> None:
        """Keep the first n slots of the last block."""
        self.length += n

    def rollback(self, length: int) -> None:
        self.length = length

    @property
    def slots(self) -> int:
        """Slots its buffers hold (its capacity rounded up to whole chunks)."""
        return self.k[0].shape[1]

    @property
    def touched(self) -> int:
        """Slots written or zeroed: those whose pages are the process's."""
        return max(self.finite, self.length)

    def reuse(self, capacity: int) -> None:
        """Start over, empty, for a generation of `capacity` slots (at most `slots`): every
        slot a generation attends to it writes first (state/kept_caches.py)."""
        self.capacity, self.length = capacity, 0

    def keep(self, indices: list[int]) -> None:
        """Keep the block slots `indices` (relative to the block, increasing), compacted in order
        into contiguous slots after the committed ones: one gather and copy per layer."""
        n = len(indices)
        if indices != list(range(n)):
            src = upload(indices, self.k[0].device) + self.length
            for buf in (*self.k, *self.v):
                buf[:, self.length:self.length + n] = buf.index_select(1, src)
        self.length += n
