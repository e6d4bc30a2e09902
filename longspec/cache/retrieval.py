"""TriForce's retrieval cache: the chunks of the full cache that matter most to the current
query, followed by every token since the last rebuild.

Keys are grouped in chunks of 8; a chunk's key is the mean of its keys and its score is the
query . chunk key summed over each key/value head's query group. Each layer and key/value head
keeps its own best chunks, the first chunk (attention sink) always among them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import copy_slots
from .full import StaticCache
from .scoring import gather_slots, group_scores

CHUNK = 8


class RetrievalCache(StaticCache):
    def __init__(self, config, budget: int, tail: int, dtype: torch.dtype, device,
                 chunk: int = CHUNK):
        if budget < 2 * chunk or budget % chunk:
            raise ValueError(f"retrieval budget must be a multiple of {chunk} of at least "
                             f"{2 * chunk}, got {budget}")
        super().__init__(config, budget + tail, dtype, device)
        self.budget = budget
        self.chunk = chunk
        self.covered = 0        # committed tokens the cache represents (selected or passed over)
        self.complete = False   # it holds every committed token: drafting with it is the target

    @property
    def tail_room(self) -> int:
        return self.capacity - self.length

    def rebuild(self, full: StaticCache, queries: Callable[[], list[torch.Tensor]]) -> None:
        """Select from the full cache's committed slots, scored with per-layer queries (asked
        for only when there is something to select)."""
        n = full.length
        whole = n // self.chunk
        recent = n - whole * self.chunk          # an incomplete last chunk is always kept
        keep = min(whole, (self.budget - recent) // self.chunk)
        self.complete = keep >= whole
        if self.complete:
            copy_slots(self, 0, full, 0, n)
            self.length = self.covered = n
            return
        offsets = torch.arange(self.chunk, device=full.k[0].device)
        for layer, q in enumerate(queries()):
            keys = full.k[layer][:, :whole * self.chunk]
            kv, _, d = keys.shape
            means = keys.view(kv, whole, self.chunk, d).mean(dim=2)
            scores = group_scores(q, means)
            scores[:, 0] = float("inf")
            best = torch.topk(scores, keep, dim=1).indices.sort(dim=1).values         # [kv, keep]
            index = (best.unsqueeze(-1) * self.chunk + offsets).view(kv, keep * self.chunk)
            size = keep * self.chunk
            self.k[layer][:, :size] = gather_slots(full.k[layer], index)
            self.v[layer][:, :size] = gather_slots(full.v[layer], index)
            self.k[layer][:, size:size + recent] = full.k[layer][:, n - recent:n]
            self.v[layer][:, size:size + recent] = full.v[layer][:, n - recent:n]
        self.length = keep * self.chunk + recent
        self.covered = n

    def append_from(self, full: StaticCache, upto: int) -> None:
        """Copy the full cache's slots [covered, upto) (exact keys and values) into the tail."""
        n = upto - self.covered
        if n <= 0:
            return
        copy_slots(self, self.length, full, self.covered, n)
        self.length += n
        self.covered = upto
