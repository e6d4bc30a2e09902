"""KV caches behind one interface (see `base.KVCache`)."""

from .base import AttentionPlan, KVCache, causal_mask
from .full import StaticCache

__all__ = ["AttentionPlan", "KVCache", "StaticCache", "causal_mask"]
