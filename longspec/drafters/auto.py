"""`auto`: every draft source the model has, merged into one scored trie.

Model-free sources always: SuffixDecoding's matches in this text and earlier outputs, and
Token Recycling's adjacency matrix of the target's own candidates; and, when the model has a
trained EAGLE drafter (bundled for it, or given as heads=), that drafter's dynamic tree, in the
steps where the suffix matches are unsure of the next token (EAGLE_BELOW). Each
node keeps the source whose estimate was best; the engine calibrates each source's estimates
from what the target accepts and verifies the prefix of the trie that pays most (sizing.py),
so a source that guesses badly on this text is simply cut away.
"""

from __future__ import annotations

from ..heads import store
from ..tree import CANDIDATES, DraftTree, TrieBuilder
from .base import Budget, Drafter
from .eagle import EagleDrafter
from .recycling import RecyclingDrafter
from .registry import MethodSpec
from .suffix import SuffixDrafter

SOURCES = ("suffix", "suffix_earlier", "recycling", "eagle")   # by the source ids nodes carry
RECYCLING, EAGLE = 2, 3
SPEC_NAME = "auto"
RECYCLING_BUDGET = Budget(32, 6)    # the recycling template within the merged trie
EAGLE_BUDGET = Budget(32, 6)        # the EAGLE drafter's tree within it (its method's default)
# The EAGLE drafter drafts in a step where the suffix matches' likeliest next token has a
# calibrated chance below this: where they are surer, its few tokens more rarely paid for its
# forwards (SmolLM2, 3 chat prompts: `auto` with the drafter ran 0.77x `auto` without it
# greedy and 0.68x at T=0.7 when it drafted every step, 0.97-0.99x and 0.90-0.95x with 0.3;
# BENCHMARKS.md). The steps it skips reach its feature cache in one forward when it next drafts.
EAGLE_BELOW = 0.3


class AutoDrafter(Drafter):
    needs_prefill_logits = True

    def __init__(self, model, sampler, drafter, context: int):
        """`drafter`: an EAGLE drafter's directory (or loaded one), or None for the one bundled
        for the model, when there is."""
        self.device = model.device
        self.suffix = SuffixDrafter(model, model.device)
        self.recycling = RecyclingDrafter(model)
        if drafter is None:
            drafter = store.find_bundled(model, "eagle")
        self.eagle = (None if drafter is None else
                      EagleDrafter(model, drafter, sampler, context, EAGLE_BUDGET,
                                   method=SPEC_NAME))
        self.needs_hidden = self.eagle is not None
        self.verified = [0] * len(SOURCES)
        self.accepted = [0] * len(SOURCES)

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.suffix.prefill(prompt_ids, cache)

    def observe_prefill(self, tokens, out) -> None:
        self.recycling.observe_prefill(tokens, out)
        if self.eagle is not None:
            self.eagle.observe_prefill(tokens, out)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        self.suffix.add_drafts(trie, committed, budget)
        if self.eagle is not None and self.suffix_chance(trie) < EAGLE_BELOW:
            self.eagle.add_drafts(trie, committed, EAGLE_BUDGET, EAGLE)
        tpl = self.recycling.template(RECYCLING_BUDGET)
        tokens = tpl.fill_by_token(committed[-1], self.recycling.matrix).tolist()
        weights = [tpl.scores[i] / tpl.scores[p] for i, p in enumerate(tpl.parents) if p >= 0]
        trie.add_tree([p - 1 for p in tpl.parents[1:]], tokens[1:], probs=weights,
                      source=RECYCLING)
        return trie.build(self.device)

    def suffix_chance(self, trie: TrieBuilder) -> float:
        """The calibrated chance of the suffix matches' likeliest next token (0 without one)."""
        trust = self.eagle.trust
        return max((trust.chance(trie.sources[i], trie.scores[i])
                    for i in range(1, len(trie.tokens)) if trie.depths[i] == 1), default=0.0)

    def observe(self, tree, target_out, verdict) -> None:
        self.recycling.observe(tree, target_out, verdict)
        if self.eagle is not None:
            self.eagle.observe(tree, target_out, verdict)
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
    name=SPEC_NAME, summary="every source the model has (suffix matches, recycling, its trained "
    "EAGLE drafter) in one scored trie, verified as far as it pays (the default)",
    budget=Budget(48, 24), needs_heads=True, stats=("sources",),
    build=lambda s: AutoDrafter(s.model, s.sampler, s.heads, s.context))
