"""Self-speculation: the target drafts a chain for itself over a retrieval cache, and verifies
it with the full cache (TriForce without the hierarchy; MagicDec-style)."""

from __future__ import annotations

import torch

from ..step.tree import DraftTree
from .base import Budget, Drafter
from .registry import MethodSpec
from .retrieval_level import LEVEL_OPTIONS, RetrievalLevel

START_GAMMA = 4


class AdaptiveGamma:
    """Chain length: one longer after a fully accepted chain, one shorter otherwise."""

    def __init__(self, start: int = START_GAMMA):
        self.value = start

    def get(self, limit: int) -> int:
        return max(1, min(self.value, limit))

    def update(self, drafted: int, accepted: int, limit: int) -> None:
        self.value = min(limit, drafted + 1) if accepted == drafted else max(1, drafted - 1)


class SelfSpecDrafter(Drafter):
    def __init__(self, target, sampler, budget: int, rebuild_every: int, max_depth: int):
        self.sampler = sampler
        self.device = target.device
        self.level = RetrievalLevel(target, budget, rebuild_every, slack=max_depth + 2)
        self.gamma = AdaptiveGamma()
        self._limit = max_depth

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.level.attach(cache)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        """A chain drafted over the retrieval cache; while the cache holds the whole context,
        drafting would be the target itself, so a plain step."""
        self._limit = budget.chain
        gamma = self.gamma.get(budget.chain)
        self.level.sync(committed)
        if self.level.cache.complete:
            return DraftTree.chain(committed[-1:], self.device)
        drafts, rows = self.level.chain.draft(committed, gamma, self.sampler.chain_choice)
        probs = torch.softmax(torch.cat(rows), dim=-1) if self.sampler.rejection else None
        return DraftTree.chain([committed[-1], *drafts], self.device, probs)

    def observe(self, tree, target_out, verdict) -> None:
        self.level.settle(len(verdict.tokens), tree.n - 1, verdict.accept_length)
        if tree.n > 1:
            self.gamma.update(tree.n - 1, verdict.accept_length, self._limit)

    def stats(self) -> dict:
        return {"retrieval_rebuilds": self.level.rebuilds}


SPEC = MethodSpec(
    name="selfspec",
    summary="the target over a retrieval KV cache (TriForce without the hierarchy)",
    budget=Budget(9, 8), samples_drafts=True, options=LEVEL_OPTIONS, stats=("retrieval_rebuilds",),
    build=lambda s: SelfSpecDrafter(s.model, s.sampler, s.options["retrieval_budget"],
                                    s.options["rebuild_every"], s.budget.max_depth))
