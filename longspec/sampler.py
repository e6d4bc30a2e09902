"""The sampling state of one generation: settings, position-keyed noise and the penalty window.

Plain decoding, tree verification and draft models all choose tokens through this object, so
the same position gets the same choice rule everywhere.
"""

from __future__ import annotations

import torch

from .penalty import PenaltyWindow
from .sampling import PositionNoise, SamplingConfig, process_logits, select_tokens
from .tree import DraftTree


class Sampler:
    def __init__(self, config: SamplingConfig, seed: int, vocab_size: int, device: torch.device):
        self.config = config
        self.seed = seed
        self.noise = None if config.greedy else PositionNoise(seed, vocab_size, device)
        self.penalty = (PenaltyWindow(int(config.penalty_window), vocab_size, device)
                        if config.uses_penalty else None)
        self.length = 0   # committed tokens, prompt included

    def commit(self, tokens: list[int]) -> None:
        self.length += len(tokens)
        if self.penalty is not None:
            self.penalty.extend(tokens)
        if self.noise is not None:
            self.noise.forget_before(self.length)

    def tree_choices(self, tree: DraftTree, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed logits [n, vocab] and the token chosen after each node [n] (node at depth d
        predicts position length + d)."""
        present = self.penalty.presence(tree) if self.penalty is not None else None
        processed = process_logits(logits, self.config, present)
        noise = None
        if self.noise is not None:
            shape = tree.shape
            noise = self.noise.rows(self.length, shape.max_depth + 1)
            if shape.n > 1:
                noise = noise[shape.depth]
        return processed, select_tokens(processed, noise)

    def chain_choice(self, logits: torch.Tensor, path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed logits [1, vocab] and the token chosen [1] after committed + path."""
        present = self.penalty.presence_after(path) if self.penalty is not None else None
        processed = process_logits(logits, self.config, present)
        noise = None if self.noise is None else self.noise.rows(self.length + len(path), 1)
        return processed, select_tokens(processed, noise)
