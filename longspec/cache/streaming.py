"""StreamingLLM cache for a small draft model: the first `sink` tokens plus a recent window.

Positions are those within the cache (a token's position is its slot), as StreamingLLM and
TriForce assign them, so a draft model never sees a position past sink + window + slack,
however long the generation. Eviction happens only in `trim`, called between steps, so rolling
back a draft never meets a shifted window; the keys it moves are rotated back by as many
positions as they move.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import copy_slots
from .full import StaticCache

SINK = 16


class StreamingCache(StaticCache):
    def __init__(self, config, window: int, slack: int, dtype: torch.dtype, device,
                 rotate: Callable[[torch.Tensor, int], torch.Tensor], sink: int = SINK):
        super().__init__(config, sink + window + slack, dtype, device)
        self.sink = sink
        self.window = window
        self.rotate = rotate      # (keys [kv, n, d], delta) -> the keys moved by delta positions

    def trim(self) -> None:
        """Drop the oldest non-sink tokens beyond the window."""
        limit = self.sink + self.window
        if self.length <= limit:
            return
        shift = self.length - limit
        copy_slots(self, self.sink, self, self.length - self.window, self.window)
        for k in self.k:
            k[:, self.sink:limit] = self.rotate(k[:, self.sink:limit], -shift)
        self.length = limit
