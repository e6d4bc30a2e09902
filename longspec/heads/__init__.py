"""Trained drafters on a frozen target: TokenSwift's multi-token heads and EAGLE's feature
drafter (modules, save/load, training)."""

from .eagle import EagleDrafterNet, find_bundled_eagle, load_eagle
from .module import HEADS_CONFIG, HEADS_WEIGHTS, MultiTokenHeads, find_bundled_heads, load_heads

__all__ = ["HEADS_CONFIG", "HEADS_WEIGHTS", "EagleDrafterNet", "MultiTokenHeads",
           "find_bundled_eagle", "find_bundled_heads", "load_eagle", "load_heads"]
