"""StreamingLLM cache for a small draft model: the first `sink` tokens plus a recent window.

Eviction happens only in `trim`, called between steps, so rolling back a draft never meets a
shifted window. Tokens keep the positions they were written with.
"""

from __future__ import annotations

import torch

from .base import copy_slots
from .full import StaticCache

SINK = 16


class StreamingCache(StaticCache):
    def __init__(self, config, window: int, slack: int, dtype: torch.dtype, device,
                 sink: int = SINK):
        super().__init__(config, sink + window + slack, dtype, device)
        self.sink = sink
        self.window = window

    def trim(self) -> None:
        """Drop the oldest non-sink tokens beyond the window."""
        limit = self.sink + self.window
        if self.length <= limit:
            return
        copy_slots(self, self.sink, self, self.length - self.window, self.window)
        self.length = limit
