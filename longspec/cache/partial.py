"""TokenSwift's dynamic partial KV cache, for the draft pass of the target model.

A budget of B slots: the first S positions (attention sink) stay, the remaining B - S slots
hold the most important earlier tokens in descending order of importance (q.k summed over each
key/value head's query group; each layer and key/value head ranks on its own). Until the slots
fill up, new tokens are appended; after that, they overwrite the least important slots from the
tail inwards, and when the tail reaches S the whole history is ranked again.

New tokens are copied from the full cache (exact keys and values) once verified; a draft pass
only writes scratch keys at the next free slot, which the copy then overwrites.
"""

from __future__ import annotations

import torch

from .base import AttentionPlan, KVCache, copy_slots
from .scoring import gather_slots, group_scores

SINK = 16


class PartialCache(KVCache):
    def __init__(self, config, budget: int, dtype: torch.dtype, device, sink: int = SINK):
        if budget <= sink + 8:
            raise ValueError(f"partial cache budget must exceed {sink + 8} (sink {sink}), "
                             f"got {budget}")
        super().__init__(config, budget, dtype, device)
        self.budget = budget
        self.sink = sink
        self.filled = 0          # slots [0, filled) hold tokens (appending phase)
        self.tail = budget       # slots [tail, budget) hold tokens added after the last ranking
        self.covered = 0         # committed tokens the cache has been brought up to
        self.rankings = 0

    def room(self) -> int:
        """Tokens that can still be added before a ranking is due."""
        return (self.budget - self.filled) + (self.tail - self.sink
                                              if self.filled == self.budget else 0)

    def _next_slots(self, q: int) -> int:
        if self.filled + q <= self.budget:
            return self.filled
        if self.filled < self.budget or self.tail - q < self.sink:
            raise RuntimeError("partial cache full: rank it again first")
        return self.tail - q

    def plan(self, q: int, block_mask: torch.Tensor | None) -> AttentionPlan:
        start = self._next_slots(q)
        n_keys = start + q if self.filled < self.budget else self.budget
        return AttentionPlan(start, q, n_keys, block_mask)

    def append_from(self, full, upto: int) -> None:
        """Add the full cache's slots [covered, upto) (exact keys and values)."""
        n = upto - self.covered
        if n <= 0:
            return
        copy_slots(self, self._next_slots(n), full, self.covered, n)
        if self.filled < self.budget:
            self.filled += n
        else:
            self.tail -= n
        self.covered = upto

    def restart_tail(self) -> None:
        """Overwrite the tokens added since the last ranking again, oldest first (the
        prefill-only ablation: no new ranking, a window of recent tokens instead)."""
        self.tail = self.budget

    def rank(self, full, queries: list[torch.Tensor]) -> None:
        """Refill from the full cache's committed slots: the sink, then the most important
        tokens by `queries` (one rotated query [heads, d] per layer), most important first."""
        n = full.length
        if n <= self.budget:
            copy_slots(self, 0, full, 0, n)
            self.filled, self.tail = n, self.budget
        else:
            keep = self.budget - self.sink
            for layer, q in enumerate(queries):
                keys = full.k[layer][:, self.sink:n]
                scores = group_scores(q, keys)                          # [kv, n - sink]
                best = torch.topk(scores, keep, dim=1).indices + self.sink  # most important first
                for mine, theirs in ((self.k[layer], full.k[layer]),
                                     (self.v[layer], full.v[layer])):
                    mine[:, :self.sink] = theirs[:, :self.sink]
                    mine[:, self.sink:self.budget] = gather_slots(theirs, best)
            self.filled, self.tail = self.budget, self.budget
        self.covered = n
        self.rankings += 1
