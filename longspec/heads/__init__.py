"""Trained drafters on a frozen target: TokenSwift's multi-token heads and EAGLE's feature
drafter (their modules, saved and loaded; training.drafters trains them)."""

from .eagle import EagleDrafterNet, load_eagle
from .module import HEADS_CONFIG, HEADS_WEIGHTS, MultiTokenHeads, load_heads

__all__ = ["HEADS_CONFIG", "HEADS_WEIGHTS", "EagleDrafterNet", "MultiTokenHeads",
           "load_eagle", "load_heads"]
