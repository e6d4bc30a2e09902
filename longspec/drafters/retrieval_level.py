"""The target model over a retrieval cache: the middle level of TriForce and selfspec's drafter.

Between steps the retrieval cache holds the selected chunks plus the exact keys and values of
every token committed since the last rebuild (copied from the full cache). It is rebuilt every
`rebuild_every` new tokens, when its tail runs out, and when acceptance collapses: the
reference builds it once, which fails for long outputs whose focus moves.
"""

from __future__ import annotations

from ..cache import StaticCache
from ..cache.retrieval import RetrievalCache
from .chain import ChainModel, root_queries
from .registry import Option

RETRIEVAL_BUDGET = 4096
REBUILD_EVERY = 128
LEVEL_OPTIONS = {"retrieval_budget": Option(RETRIEVAL_BUDGET),
                 "rebuild_every": Option(REBUILD_EVERY)}
# rebuild early when this many steps in a row accept no draft token
STALL_STEPS = 4


class RetrievalLevel:
    def __init__(self, target, budget: int, rebuild_every: int, slack: int):
        self.target = target
        cache = RetrievalCache(target.config, budget, rebuild_every + slack, target.dtype,
                               target.device)
        self.chain = ChainModel(target.net, cache)
        self.rebuild_every = rebuild_every
        self.slack = slack
        self.full: StaticCache | None = None
        self.since_rebuild = 0
        self.stalled = 0
        self.rebuilds = 0

    @property
    def cache(self) -> RetrievalCache:
        return self.chain.cache

    def attach(self, full: StaticCache) -> None:
        self.full = full

    def _rebuild(self, committed: list[int]) -> None:
        """Re-select chunks with the queries of the root token over the full cache."""
        self.cache.rebuild(self.full, lambda: root_queries(self.target.net, committed, self.full))
        self.since_rebuild = 0
        self.stalled = 0
        self.rebuilds += 1

    def sync(self, committed: list[int]) -> None:
        """Bring the cache to the committed sequence but its last token (the root)."""
        self.chain.rewind(self.cache.covered)
        due = (self.since_rebuild >= self.rebuild_every or self.stalled >= STALL_STEPS
               or self.cache.tail_room < self.full.length - self.cache.covered + self.slack)
        if due or self.rebuilds == 0:
            self._rebuild(committed)
        else:
            self.cache.append_from(self.full, self.full.length)
        self.chain.fed = self.cache.covered

    def settle(self, new_tokens: int, drafted: int, accepted: int) -> None:
        """After the final verification: forget the draft pass, count progress."""
        self.chain.rewind(self.cache.covered)
        self.since_rebuild += new_tokens
        if drafted:
            self.stalled = self.stalled + 1 if accepted == 0 else 0
