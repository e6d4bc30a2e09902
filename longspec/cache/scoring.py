"""Importance of cached keys for a query, for caches that keep a subset of the history."""

from __future__ import annotations

import torch


def group_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q.k summed over each key/value head's group of query heads.

    query [heads, d] (one token's rotated queries), keys [kv_heads, n, d] -> scores [kv_heads, n].
    Query head h belongs to key/value head h // group, as in the attention, and the keys are
    never replicated: the group's queries are summed first (q1.k + q2.k = (q1 + q2).k).
    """
    kv_heads = keys.shape[0]
    summed = query.view(kv_heads, -1, query.shape[-1]).sum(dim=1)       # [kv, d]
    return torch.bmm(keys, summed.unsqueeze(-1).to(keys.dtype)).squeeze(-1).float()


def gather_slots(buf: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """buf [kv, n, d] rows picked per head: index [kv, m] -> [kv, m, d]."""
    return torch.gather(buf, 1, index.unsqueeze(-1).expand(-1, -1, buf.shape[-1]))
