"""Prompt lookup decoding (Saxena 2023): copy what followed the latest earlier occurrence of the
longest suffix (4 down to 1 tokens) of the committed text.

The index maps each n-gram to where its most recent earlier occurrence continues, and grows by
one entry per n for each committed token, so a lookup costs the same at any output length.
"""

from __future__ import annotations

import torch

from ..step.tree import DraftTree
from .base import Budget, Drafter
from .registry import MethodSpec

MAX_NGRAM = 4


class NgramIndex:
    """n-gram (n = 1..MAX_NGRAM) -> index just after its most recent occurrence that is not the
    current suffix (so that the continuation is known)."""

    def __init__(self, max_n: int = MAX_NGRAM):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.next_after: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            # the n-grams ending at the current last token get their continuation: `token`
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                self.next_after[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens continuing the longest suffix seen before (empty when none is)."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), 0, -1):
            start = self.next_after.get(tuple(toks[len(toks) - n:]))
            if start is not None:
                return toks[start:start + k]
        return []


class PromptLookupDrafter(Drafter):
    plain_steps = True

    def __init__(self, device: torch.device):
        self.device = device
        self.index = NgramIndex()

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.index.extend(prompt_ids)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        self.index.extend(committed[len(self.index.tokens):])
        return DraftTree.chain([committed[-1], *self.index.lookup(budget.chain)], self.device)


SPEC = MethodSpec(
    name="pld", summary="the continuation of the longest earlier match of the last 4..1 tokens "
    "(prompt lookup)",
    budget=Budget(5, 4), build=lambda setup: PromptLookupDrafter(setup.model.device))
