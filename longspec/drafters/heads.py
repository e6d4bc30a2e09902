"""Multi-token heads as a drafter (Medusa-style, with TokenSwift's chained heads).

The verify forward returns hidden states; the heads read the one of the last accepted node,
whose own next token is the bonus (the new root), so head i guesses depth i below the root.
The tree is a static template over the heads' top-ranked tokens (higher ranks get more
children), filled with one gather and no host work.
"""

from __future__ import annotations

import torch

from ..heads import find_bundled_heads, load_heads
from ..tree import DraftTree, TreeShape
from .base import Budget, Drafter
from .recycling import WIDTH, RecyclingTemplate


def resolve_heads(model, heads):
    """Loaded heads for `model` from a path, a module, or the bundled demo heads (None)."""
    from ..heads.module import MultiTokenHeads

    if isinstance(heads, MultiTokenHeads):
        return heads.to(device=model.device, dtype=model.dtype)
    path = heads if heads is not None else find_bundled_heads(model)
    if path is None:
        raise ValueError("this method needs multi-token heads: pass heads=PATH (--heads PATH), "
                         "or train them with 'longspec train-heads'")
    return load_heads(path, model)


class HeadsTemplate(RecyclingTemplate):
    """A static template whose level-d nodes take the rank-r token of head d (every parent at
    a level shares the same candidates: heads do not see the path)."""

    def fill_from(self, root: int, candidates: torch.Tensor) -> torch.Tensor:
        """candidates [depth, width] token ids, best first -> tokens [n]."""
        tokens = torch.empty(self.shape.n, dtype=torch.long, device=candidates.device)
        tokens[0] = root
        for level, (nodes, _, ranks) in enumerate(self.levels):
            tokens[nodes] = candidates[level, ranks]
        return tokens


class HeadsDrafter(Drafter):
    needs_hidden = True

    def __init__(self, model, heads, sampler):
        self.net = model.net
        self.heads = resolve_heads(model, heads)
        self.sampler = sampler
        self.device = model.device
        self.hidden: torch.Tensor | None = None
        self.root_only = TreeShape([-1], self.device)
        self._templates: dict[Budget, HeadsTemplate] = {}

    def template(self, budget: Budget) -> HeadsTemplate:
        depth = min(budget.max_depth, self.heads.gamma)
        key = Budget(budget.max_nodes, depth)
        if key not in self._templates:
            self._templates[key] = HeadsTemplate(budget.max_nodes, depth, self.device)
        return self._templates[key]

    def observe_prefill(self, tokens, out) -> None:
        self.hidden = out.hidden[-1:]

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        tpl = self.template(budget)
        if self.hidden is None:
            return DraftTree(self.root_only, torch.tensor(committed[-1:], device=self.device))
        depth = tpl.shape.max_depth
        logits = self.heads.logits(self.net, self.hidden)[:depth, 0]        # [depth, vocab]
        cands = torch.topk(self.sampler.guess_scores(logits, 1), WIDTH, dim=-1).indices
        return DraftTree(tpl.shape, tpl.fill_from(committed[-1], cands))

    def observe(self, tree, target_out, verdict) -> None:
        self.hidden = target_out.forward.hidden[verdict.accepted[-1]:verdict.accepted[-1] + 1]
