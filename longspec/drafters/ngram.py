"""TokenSwift's token reutilization: the most frequent 4-grams of the text, as draft chains.

The prompt's 4-grams count as well as the output's. With a contextual penalty on, a 4-gram
enters the table once all its tokens have left the penalty's window (inside it, repeats are
penalised and unlikely); without one, as soon as it is written. Counts are exact; ties break
on the tokens themselves, so a query returns what a brute-force counter sorted by
(-count, tokens) returns.
"""

from __future__ import annotations

import torch

from ..step.tree import CANDIDATES, DraftTree, TrieBuilder
from .base import Budget, Drafter
from .registry import MethodSpec, Option

NGRAM = 4
TOP_K = 20
CHAIN_FOLLOW = 0.8      # assumed chance that a chain's next token follows (calibrated online)


class NgramTable:
    """Counts of 4-grams, with the top-k continuations of each first token kept up to date."""

    def __init__(self, top_k: int = TOP_K):
        self.top_k = top_k
        self.counts: dict[int, dict[tuple[int, ...], int]] = {}
        self.top: dict[int, list[tuple[int, tuple[int, ...]]]] = {}   # first -> [(-count, rest)]
        self.totals: dict[int, int] = {}                                  # first -> 4-grams

    def add(self, gram: tuple[int, ...]) -> None:
        if self.top_k == 0:
            return
        first, rest = gram[0], gram[1:]
        counts = self.counts.setdefault(first, {})
        count = counts.get(rest, 0) + 1
        counts[rest] = count
        self.totals[first] = self.totals.get(first, 0) + 1
        top = self.top.setdefault(first, [])
        entry = (-count, rest)
        # counts only grow: only `rest` can move, and only up
        for i, (_, r) in enumerate(top):
            if r == rest:
                top[i] = entry
                top.sort()
                return
        if len(top) < self.top_k or entry < top[-1]:
            top.append(entry)
            top.sort()
            del top[self.top_k:]

    def continuations(self, first: int) -> list[tuple[int, ...]]:
        """The top-k most frequent 4-grams starting with `first`, without `first`."""
        return [rest for _, rest in self.top.get(first, ())]

    def frequencies(self, first: int) -> list[tuple[tuple[int, ...], float]]:
        """The same continuations with the share of `first`'s 4-grams each makes up."""
        total = self.totals.get(first, 0)
        return [(rest, -neg / (total + 1)) for neg, rest in self.top.get(first, ())]


def penalty_window(config) -> int:
    """The window 4-grams must leave before they count: the penalty's, or none."""
    return int(config.penalty_window) if config.uses_penalty else 0


class NgramDrafter(Drafter):
    """Chains from the n-gram table for the root token, merged into one trie."""
    plain_steps = True

    def __init__(self, device: torch.device, window: int, top_k: int = TOP_K):
        self.device = device
        self.window = window    # 0 without a penalty
        self.table = NgramTable(top_k)
        self.tokens: list[int] = []
        self.next_start = 0     # first position whose 4-gram is not yet counted

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.tokens = list(prompt_ids)

    def sync(self, committed: list[int]) -> None:
        """Count the 4-grams that have left the penalty window (all of them without one)."""
        self.tokens.extend(committed[len(self.tokens):])
        out_of_window = len(self.tokens) - self.window
        while self.next_start + NGRAM <= out_of_window:
            self.table.add(tuple(self.tokens[self.next_start:self.next_start + NGRAM]))
            self.next_start += 1

    def add_chains(self, trie: TrieBuilder, first: int, parent: int, source: int = 0) -> None:
        """Add the table's chains for `first` below node `parent` of `trie`, the first token
        scored by its share of `first`'s 4-grams (the rest by CHAIN_FOLLOW)."""
        for rest, share in self.table.frequencies(first):
            if trie.full:
                return
            trie.add_chain(list(rest), parent, [share] + [CHAIN_FOLLOW] * (len(rest) - 1),
                           source)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        self.sync(committed)
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        self.add_chains(trie, committed[-1], 0)
        return trie.build(self.device)


SPEC = MethodSpec(
    name="ngram", summary="the most frequent 4-grams of the text (once out of the penalty window) "
    "(TokenSwift's token reutilization)",
    budget=Budget(16, 3), options={"top_k": Option(TOP_K, minimum=0)},
    build=lambda setup: NgramDrafter(setup.model.device, penalty_window(setup.sampler.config),
                                     setup.options["top_k"]))
