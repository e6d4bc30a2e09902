"""`auto`: every draft source the model has, merged into one scored trie.

Model-free sources always: SuffixDecoding's matches in this text and earlier outputs, and
Token Recycling's adjacency matrix of the target's own candidates. Each node keeps the source
whose estimate was best; the engine calibrates each source's estimates from what the target
accepts and verifies the prefix of the trie that pays most (sizing.py), so a source that
guesses badly on this text is simply cut away.
"""

from __future__ import annotations

from ..tree import CANDIDATES, DraftTree, TrieBuilder
from .base import Budget, Drafter
from .recycling import RecyclingDrafter
from .registry import MethodSpec
from .suffix import SuffixDrafter

SOURCES = ("suffix", "suffix_earlier", "recycling")   # by the source ids nodes carry
RECYCLING = 2
RECYCLING_NODES = 32      # the recycling template's size within the merged trie
RECYCLING_DEPTH = 6


class AutoDrafter(Drafter):
    needs_prefill_logits = True

    def __init__(self, model):
        self.device = model.device
        self.suffix = SuffixDrafter(model, model.device)
        self.recycling = RecyclingDrafter(model)
        self.verified = [0] * len(SOURCES)
        self.accepted = [0] * len(SOURCES)

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.suffix.prefill(prompt_ids, cache)

    def observe_prefill(self, tokens, out) -> None:
        self.recycling.observe_prefill(tokens, out)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        self.suffix.add_drafts(trie, committed, budget)
        tpl = self.recycling.template(Budget(RECYCLING_NODES, RECYCLING_DEPTH))
        tokens = tpl.fill_by_token(committed[-1], self.recycling.matrix).tolist()
        weights = [tpl.scores[i] / tpl.scores[p] for i, p in enumerate(tpl.parents) if p >= 0]
        trie.add_tree([p - 1 for p in tpl.parents[1:]], tokens[1:], probs=weights,
                      source=RECYCLING)
        return trie.build(self.device)

    def observe(self, tree, target_out, verdict) -> None:
        self.recycling.observe(tree, target_out, verdict)
        passed = set(verdict.accepted)
        for node in range(1, tree.n):
            source = tree.sources[node]
            self.verified[source] += 1
            self.accepted[source] += node in passed

    def finish(self, tokens: list[int]) -> None:
        self.suffix.finish(tokens)

    def stats(self) -> dict:
        return {"sources": {name: {"verified": self.verified[i], "accepted": self.accepted[i]}
                            for i, name in enumerate(SOURCES)}}


SPEC = MethodSpec(
    name="auto", summary="every source the model has (suffix matches, recycling) in one scored "
    "trie, verified as far as it pays (the default)",
    budget=Budget(48, 24), stats=("sources",), build=lambda setup: AutoDrafter(setup.model))
