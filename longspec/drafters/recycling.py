"""Token Recycling (Luo et al. 2024): reuse the candidates the target already produced.

An adjacency matrix M [vocab, 8] holds, for each token, the top-8 tokens the target predicted
after it, refreshed from every tree node's raw logits after each verify (rejected nodes
included; raw, because with top-p or min-p most processed logits are -inf).
The draft is a static tree template: each node's children are its token's top-ranked successors
in M, so filling the template is one gather per level, with no host work. A generation starts
from the M the last generation on the model ended with (a hot start: the model's shared state
keeps a copy) and hands its own back when it ends; the prompt's logits seed it at prefill.
"""

from __future__ import annotations

import torch

from ..step.forward import ForwardOutput
from ..step.tree import DraftTree, TreeTemplate
from .base import Budget, Drafter
from .registry import MethodSpec

WIDTH = 8
HOT_START = ("recycling_matrix",)     # the key of M in the model's shared state


class RecyclingDrafter(Drafter):
    needs_prefill_logits = True
    plain_steps = True

    def __init__(self, model):
        self.device = model.device
        self.shared = model.state
        vocab = model.config.vocab_size
        self.matrix = model.state.checkout(
            HOT_START, lambda: torch.arange(WIDTH, device=self.device).repeat(vocab, 1) % vocab)
        self._templates: dict[Budget, TreeTemplate] = {}

    def update(self, tokens: torch.Tensor, out: ForwardOutput) -> None:
        """M[token] = the top-8 tokens of the logits that followed it."""
        self.matrix[tokens] = out.top_tokens(WIDTH)

    def observe_prefill(self, tokens, out) -> None:
        self.update(tokens, out)

    def template(self, budget: Budget) -> TreeTemplate:
        tpl = self._templates.get(budget)
        if tpl is None:
            tpl = self._templates[budget] = TreeTemplate(budget.max_nodes, budget.max_depth,
                                                         self.device, WIDTH)
        return tpl

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        tpl = self.template(budget)
        return DraftTree(tpl.shape, tpl.fill_by_token(committed[-1], self.matrix),
                         scores=tpl.scores, sources=[0] * tpl.shape.n)

    def observe(self, tree, target_out, verdict) -> None:
        self.update(tree.tokens, target_out.forward)

    def finish(self, tokens: list[int]) -> None:
        self.shared.publish(HOT_START, self.matrix)


SPEC = MethodSpec(
    name="recycling", summary="an adjacency matrix of the target's own top-8 candidates, in a "
    "static tree (Token Recycling)",
    budget=Budget(32, 6), build=lambda setup: RecyclingDrafter(setup.model))
