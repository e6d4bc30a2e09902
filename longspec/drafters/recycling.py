"""Token Recycling (Luo et al. 2024): reuse the candidates the target already produced.

An adjacency matrix M [vocab, 8] holds, for each token, the top-8 tokens the target predicted
after it, refreshed from every tree node's logits after each verify (rejected nodes included).
The draft is a static tree template: each node's children are its token's top-ranked successors
in M, so filling the template is one gather per level, with no host work. M lives in the
model's `state`, so it persists across calls (hot start); the prompt's logits seed it at prefill.
"""

from __future__ import annotations

import heapq

import torch

from ..tree import DraftTree, TreeShape
from .base import Budget, Drafter

WIDTH = 8
# Assumed chance that the successor of rank r is the target's next token: a best-first tree
# under these weights gives higher-ranked nodes more children, as in the paper's template.
RANK_WEIGHTS = (0.45, 0.15, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)


def template(max_nodes: int, max_depth: int, width: int = WIDTH) -> tuple[list[int], list[int]]:
    """Static tree (parents, ranks) of at most max_nodes nodes (root included), max_depth
    levels and `width` children a node, in BFS order: the max_nodes - 1 paths of highest
    product of RANK_WEIGHTS."""
    chosen = [(-1, -1, 0)]          # (parent, rank, depth) in the order picked
    heap = [(-RANK_WEIGHTS[0], 0, 0, 0)]   # (-score, tie, parent, rank)
    tie = 1
    while heap and len(chosen) < max_nodes:
        neg, _, parent, rank = heapq.heappop(heap)
        depth = chosen[parent][2] + 1
        node = len(chosen)
        chosen.append((parent, rank, depth))
        if rank + 1 < width:        # the next sibling
            sibling = -neg / RANK_WEIGHTS[rank] * RANK_WEIGHTS[rank + 1]
            heapq.heappush(heap, (-sibling, tie, parent, rank + 1))
            tie += 1
        if depth < max_depth:       # the first child
            heapq.heappush(heap, (neg * RANK_WEIGHTS[0], tie, node, 0))
            tie += 1
    children: dict[int, list[tuple[int, int]]] = {}
    for node, (parent, rank, _) in enumerate(chosen[1:], start=1):
        children.setdefault(parent, []).append((rank, node))
    order = [0]
    for node in order:                      # breadth-first, siblings by rank
        order.extend(child for _, child in sorted(children.get(node, ())))
    new = {old: k for k, old in enumerate(order)}
    parents = [-1] + [new[chosen[i][0]] for i in order[1:]]
    ranks = [chosen[i][1] for i in order]
    return parents, ranks


class RecyclingTemplate:
    """The template's shape plus, per level, the gather indices that fill its tokens."""

    def __init__(self, max_nodes: int, max_depth: int, device: torch.device):
        parents, ranks = template(max_nodes, max_depth)
        self.shape = TreeShape(parents, device)
        depths = self.shape.depths
        self.levels = []
        for d in range(1, self.shape.max_depth + 1):
            nodes = [i for i in range(len(parents)) if depths[i] == d]
            self.levels.append((torch.tensor(nodes, device=device),
                                torch.tensor([parents[i] for i in nodes], device=device),
                                torch.tensor([ranks[i] for i in nodes], device=device)))

    def fill(self, root: int, matrix: torch.Tensor) -> torch.Tensor:
        """Tokens [n] for the root token: children from the matrix, level by level."""
        tokens = torch.empty(self.shape.n, dtype=torch.long, device=matrix.device)
        tokens[0] = root
        for nodes, parents, ranks in self.levels:
            tokens[nodes] = matrix[tokens[parents], ranks]
        return tokens


class RecyclingDrafter(Drafter):
    needs_prefill_logits = True

    def __init__(self, model):
        self.device = model.device
        key = "recycling_matrix"
        if key not in model.state:
            vocab = model.config.vocab_size
            model.state[key] = torch.arange(WIDTH, device=self.device).repeat(vocab, 1) % vocab
        self.matrix = model.state[key]
        self._templates: dict[Budget, RecyclingTemplate] = {}

    def update(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """M[token] = the top-8 tokens of the logits that followed it."""
        self.matrix[tokens] = torch.topk(logits, WIDTH, dim=-1).indices

    def observe_prefill(self, tokens, out) -> None:
        self.update(tokens, out.logits)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        tpl = self._templates.get(budget)
        if tpl is None:
            tpl = self._templates[budget] = RecyclingTemplate(budget.max_nodes, budget.max_depth, self.device)
        return DraftTree(tpl.shape, tpl.fill(committed[-1], self.matrix))

    def observe(self, tree, target_out, verdict) -> None:
        self.update(tree.tokens, target_out.processed)
