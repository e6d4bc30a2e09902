"""TokenSwift's multi-token heads: module, save/load, training."""

from .module import HEADS_CONFIG, HEADS_WEIGHTS, MultiTokenHeads, find_bundled_heads, load_heads

__all__ = ["HEADS_CONFIG", "HEADS_WEIGHTS", "MultiTokenHeads", "find_bundled_heads", "load_heads"]
