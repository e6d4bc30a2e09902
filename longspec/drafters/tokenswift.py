"""TokenSwift: multi-token heads, n-gram reutilization and a dynamic partial KV cache.

Each step (draft_pass="partial", as the paper describes): the target runs the root over its
partial cache; its own logits give the depth-1 token (chosen by the target's rule, so it is the
target's pick whenever the partial cache is close enough), and the heads on the same hidden
state give candidates for depths 2..4. The tree [1, 3, 3, 3] of those candidates and the top-k
n-gram chains that start with the depth-1 token are merged into one trie, which the target
verifies with its full cache. The partial cache then takes the accepted tokens' exact keys.

With draft_pass="verify" the heads read the verify forward's hidden state of the last accepted
node instead (no draft pass; depths 1..3), and the n-gram chains start at the root. The paper's
ablations are options too: draft_pass="full" runs the draft pass over the full cache, and
partial_mode="static" ranks the partial cache once after the prefill and never again.
"""

from __future__ import annotations

import torch

from ..cache.partial import PartialCache
from ..step.tree import CANDIDATES, DraftTree, TreeTemplate, TrieBuilder
from .base import Budget, Drafter
from .chain import root_queries
from .heads import HeadGuesses
from .ngram import TOP_K, NgramDrafter, penalty_window
from .registry import MethodSpec, Option

DRAFT_PASSES = ("partial", "verify", "full")
PARTIAL_MODES = ("dynamic", "static")
PARTIAL_BUDGET = 4096
HEADS_TOP_K = 3            # candidates per head: tree [1, 3, 3, 3]
DRAFT_PASS, HEADS, NGRAMS = 0, 1, 2     # sources of the trie's nodes, calibrated apart


class TokenSwiftDrafter(Drafter):
    def __init__(self, model, heads, sampler, draft_pass: str, partial_budget: int,
                 ngram_top_k: int, heads_nodes: int, partial_mode: str = "dynamic"):
        self.net = model.net
        self.guesses = HeadGuesses(model, heads, sampler)
        self.sampler = sampler
        self.device = model.device
        self.draft_pass = draft_pass
        self.partial_mode = partial_mode
        self.needs_hidden = draft_pass == "verify"
        self.ngram = NgramDrafter(model.device, penalty_window(sampler.config), ngram_top_k)
        self.partial = (PartialCache(model.config, partial_budget, model.dtype, model.device)
                        if draft_pass == "partial" else None)
        # the heads' part of the tree: the best paths over ranks < HEADS_TOP_K
        tpl = TreeTemplate(heads_nodes + 1, self.guesses.gamma, model.device, HEADS_TOP_K)
        self.heads_parents = [p - 1 for p in tpl.parents[1:]]          # -1: hangs off the anchor
        self.heads_index = list(zip(tpl.shape.depths[1:], tpl.ranks[1:]))  # (head, rank) of a node
        self.full = None
        self.hidden: torch.Tensor | None = None
        self.queries: list[torch.Tensor] | None = None

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.full = cache
        self.ngram.prefill(prompt_ids, cache)

    def observe_prefill(self, tokens, out) -> None:
        self.hidden = out.hidden[-1:]

    def sync_partial(self, committed: list[int]) -> None:
        """Bring the partial cache to the committed sequence but the root, ranking it again
        when the new tokens (and the draft pass's scratch slot) no longer fit."""
        pending = self.full.length - self.partial.covered
        if (self.partial.rankings and self.partial.room() < pending + 1
            and self.partial_mode == "static"):
            self.partial.restart_tail()
        if self.partial.rankings == 0 or self.partial.room() < pending + 1:
            queries = self.queries or root_queries(self.net, committed, self.full)
            self.partial.rank(self.full, queries)
        else:
            self.partial.append_from(self.full, self.full.length)

    def draft_pass_candidates(self, committed: list[int]
                              ) -> tuple[int, float, tuple[torch.Tensor, torch.Tensor]]:
        """The depth-1 token, its chance, and head candidates with their chances [gamma, k]
        for depths 2.. from a forward of the root over the partial cache (or the full one:
        its slot for the root is scratch until the verify pass writes it)."""
        cache = self.full
        if self.draft_pass == "partial":
            self.sync_partial(committed)
            cache = self.partial
        root = len(committed) - 1
        out = self.net(torch.tensor(committed[-1:], device=self.device),
                       torch.tensor([root], device=self.device), cache,
                       return_hidden=True, return_queries=True)
        self.queries = out.queries
        processed, first = self.sampler.chain_choice(out.logits, [])
        chance = torch.softmax(processed[0], -1)[first]
        return first, chance, self.guesses.candidates(out.hidden, 2, HEADS_TOP_K)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        """The trie of the draft pass's token, the heads' tree below it and the n-gram chains,
        each node scored; the engine verifies the prefix of its score order that pays."""
        self.ngram.sync(committed)
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        if self.draft_pass != "verify":
            first, chance, (cands, probs) = self.draft_pass_candidates(committed)
            anchor = trie.child(0, first, float(chance), DRAFT_PASS)
            ngram_first, ngram_parent = first, anchor
        else:
            if self.hidden is None:
                return trie.build(self.device)
            cands, probs = self.guesses.candidates(self.hidden, 1, HEADS_TOP_K)
            anchor = 0
            ngram_first, ngram_parent = committed[-1], 0
        if anchor is None:
            return trie.build(self.device)
        tokens, chances = torch.stack([cands.float(), probs.float()]).tolist()   # one host sync
        trie.add_tree(self.heads_parents, [int(tokens[d - 1][r]) for d, r in self.heads_index],
                      anchor, [chances[d - 1][r] for d, r in self.heads_index], HEADS)
        self.ngram.add_chains(trie, ngram_first, ngram_parent, NGRAMS)
        return trie.build(self.device)

    def observe(self, tree, target_out, verdict) -> None:
        if self.needs_hidden:
            last = verdict.accepted[-1]
            self.hidden = target_out.forward.hidden[last:last + 1]

    def stats(self) -> dict:
        return {"partial_rankings": self.partial.rankings} if self.partial is not None else {}


SPEC = MethodSpec(
    name="tokenswift", summary="a draft pass over a dynamic partial KV cache + multi-token heads "
    "+ n-gram chains, one trie",
    budget=Budget(24, 4), needs_heads=True, stats=("partial_rankings",),
    options={"draft_pass": Option(DRAFT_PASSES[0], choices=DRAFT_PASSES),
             "partial_mode": Option(PARTIAL_MODES[0], choices=PARTIAL_MODES),
             "partial_budget": Option(PARTIAL_BUDGET), "ngram_top_k": Option(TOP_K, minimum=0),
             "heads_nodes": Option(39, minimum=0)},
    build=lambda s: TokenSwiftDrafter(s.model, s.heads, s.sampler, s.options["draft_pass"],
                                      s.options["partial_budget"], s.options["ngram_top_k"],
                                      s.options["heads_nodes"], s.options["partial_mode"]))
