"""Multi-token heads as a drafter (Medusa-style, with TokenSwift's chained heads).

The verify forward returns hidden states; the heads read the one of the last accepted node,
whose own next token is the bonus (the new root), so head i guesses depth i below the root.
The tree is a static template over the heads' top-ranked tokens (higher ranks get more
children), filled with one gather and no host work.
"""

from __future__ import annotations

import torch

from ..heads import MultiTokenHeads, load_heads, store
from ..step.tree import DraftTree, TreeTemplate
from .base import Budget, Drafter
from .registry import MethodSpec

WIDTH = 8


class HeadGuesses:
    """A model's heads with the generation's sampling rule: ranked guesses for the tokens
    below a hidden state."""

    def __init__(self, model, heads, sampler):
        self.net = model.net
        self.heads = store.resolve(model, heads, "heads", "multi-token heads", MultiTokenHeads,
                                   load_heads)
        self.sampler = sampler

    @property
    def gamma(self) -> int:
        return self.heads.gamma

    def candidates(self, hidden: torch.Tensor, first_depth: int, k: int,
                   depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k tokens [depth, k] that heads 1..depth (all by default) guess for depths
        first_depth.. below the root, from one hidden state [1, hidden], and the chance
        [depth, k] each head gives its guess (its processed distribution's)."""
        logits = self.heads.logits(self.net, hidden)[:depth, 0]        # [depth, vocab]
        tokens = torch.topk(self.sampler.guess_scores(logits, first_depth), k, dim=-1).indices
        probs = torch.softmax(self.sampler.guess_scores(logits, first_depth, noise=False), -1)
        return tokens, probs.gather(-1, tokens)


class HeadsDrafter(Drafter):
    needs_hidden = True

    def __init__(self, model, heads, sampler):
        self.guesses = HeadGuesses(model, heads, sampler)
        self.device = model.device
        self.hidden: torch.Tensor | None = None
        self._templates: dict[Budget, TreeTemplate] = {}

    def template(self, budget: Budget) -> TreeTemplate:
        key = Budget(budget.max_nodes, min(budget.max_depth, self.guesses.gamma))
        if key not in self._templates:
            self._templates[key] = TreeTemplate(key.max_nodes, key.max_depth, self.device, WIDTH)
        return self._templates[key]

    def observe_prefill(self, tokens, out) -> None:
        self.hidden = out.hidden[-1:]

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        if self.hidden is None:
            return DraftTree.chain(committed[-1:], self.device)
        tpl = self.template(budget)
        cands, probs = self.guesses.candidates(self.hidden, 1, WIDTH, tpl.shape.max_depth)
        table = probs.tolist()                       # the draft's host sync
        scores = [1.0] * tpl.shape.n
        for i, (p, depth) in enumerate(zip(tpl.parents, tpl.shape.depths)):
            if p >= 0:
                scores[i] = scores[p] * table[depth - 1][tpl.ranks[i]]
        return DraftTree(tpl.shape, tpl.fill_by_depth(committed[-1], cands), scores=scores,
                         sources=[0] * tpl.shape.n)

    def observe(self, tree, target_out, verdict) -> None:
        last = verdict.accepted[-1]
        self.hidden = target_out.forward.hidden[last:last + 1]


SPEC = MethodSpec(
    name="heads", summary="multi-token heads on the verify pass's hidden state",
    budget=Budget(16, 3), needs_heads=True,
    build=lambda setup: HeadsDrafter(setup.model, setup.heads, setup.sampler))
