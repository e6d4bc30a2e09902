"""Token Recycling (Luo et al. 2024): reuse the candidates the target already produced.

An adjacency matrix M [vocab, 8] holds, for each token, the top-8 tokens the target predicted
after it, and V [vocab, 8] their logits, refreshed from every tree node's raw logits after each
verify (rejected nodes included; raw, because with top-p or min-p most processed logits are
-inf). The draft is a static tree template: each node's children are its token's successors in
M, ranked as the target's choice at their position would rank them: V processed as the sampler
processes logits (penalty, temperature, filters among the 8) plus, when sampling, the Gumbel
noise of that position, which decides the target's pick (sampler.guess_scores). Greedy without
a penalty that is M's own order. Filling the template is a few small operations per level,
with no host work. M and V live in the model's `state`, so they persist across calls (hot
start); the prompt's logits seed them at prefill.
"""

from __future__ import annotations

import torch

from ..tree import DraftTree, TreeTemplate
from .base import Budget, Drafter
from .registry import MethodSpec

WIDTH = 8


class RecyclingDrafter(Drafter):
    needs_prefill_logits = True

    def __init__(self, model, sampler):
        self.device = model.device
        self.sampler = sampler
        if "recycling_matrix" not in model.state:
            vocab = model.config.vocab_size
            model.state["recycling_matrix"] = (
                torch.arange(WIDTH, device=self.device).repeat(vocab, 1) % vocab)
            model.state["recycling_logits"] = torch.zeros(vocab, WIDTH, device=self.device)
        self.matrix = model.state["recycling_matrix"]
        self.logits = model.state["recycling_logits"]
        self._templates: dict[Budget, TreeTemplate] = {}

    def update(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """M[token], V[token] = the top-8 tokens of the logits that followed it, and theirs."""
        top = torch.topk(logits, WIDTH, dim=-1)
        self.matrix[tokens] = top.indices
        self.logits[tokens] = top.values.float()

    def fill(self, tpl: TreeTemplate, root: int) -> torch.Tensor:
        """The template's tokens [n] under `root`: a node of rank r is the r-th of its parent
        token's successors as the target's choice at its position would rank them."""
        tokens = torch.empty(tpl.shape.n, dtype=torch.long, device=self.device)
        tokens[0] = root
        for depth, (nodes, parents, ranks) in enumerate(tpl.levels, 1):
            before = tokens[parents]
            successors = self.matrix[before]                                    # [m, WIDTH]
            scores = self.sampler.guess_scores(self.logits[before], depth, same_depth=True,
                                               columns=successors)
            order = scores.argsort(dim=-1, descending=True, stable=True)
            tokens[nodes] = successors.gather(1, order.gather(1, ranks[:, None]))[:, 0]
        return tokens

    def observe_prefill(self, tokens, out) -> None:
        self.update(tokens, out.logits)

    def template(self, budget: Budget) -> TreeTemplate:
        tpl = self._templates.get(budget)
        if tpl is None:
            tpl = self._templates[budget] = TreeTemplate(budget.max_nodes, budget.max_depth,
                                                         self.device, WIDTH)
        return tpl

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        tpl = self.template(budget)
        return DraftTree(tpl.shape, self.fill(tpl, committed[-1]),
                         scores=tpl.scores, sources=[0] * tpl.shape.n)

    def observe(self, tree, target_out, verdict) -> None:
        self.update(tree.tokens, target_out.forward.logits)


SPEC = MethodSpec(
    name="recycling", summary="an adjacency matrix of the target's own top-8 candidates, in a "
    "static tree (Token Recycling)",
    budget=Budget(32, 6), build=lambda setup: RecyclingDrafter(setup.model, setup.sampler))
