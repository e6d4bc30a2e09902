"""Tree verification: which draft nodes the target accepts, and the bonus token.

`target_tokens[i]` is the token the target chooses after node i (argmax of its processed logits,
plus the position's Gumbel noise when sampling). A node is accepted when its token equals its
parent's target token and its parent is accepted. The deepest accepted node ends the chain, and
its target token is the bonus. In a trie at most one child of a node can match, so the chain is
unique, and the output equals what plain decoding would write.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]   # node indices of the accepted chain, root first
    tokens: list[int]     # new tokens: the accepted draft tokens, then the bonus token

    @property
    def accept_length(self) -> int:
        """Accepted draft tokens (the bonus not counted)."""
        return len(self.accepted) - 1


def accepted_nodes(tree: DraftTree, target_tokens: torch.Tensor) -> torch.Tensor:
    """Bool [n]: node accepted (its whole path matches the target's choices)."""
    shape = tree.shape
    match = tree.tokens == target_tokens[shape.parent]
    match[0] = True
    return ~(shape.ancestors & ~match[None, :]).any(dim=1)


def verify_tree(tree: DraftTree, target_tokens: torch.Tensor) -> Verdict:
    """Accepted chain and bonus token, with one host transfer."""
    shape = tree.shape
    if shape.n == 1:
        return Verdict([0], [int(target_tokens[0])])
    accepted = accepted_nodes(tree, target_tokens)
    best = (accepted * (shape.depth + 1)).argmax()
    path = shape.paths[best]
    packed = torch.cat([target_tokens[best].view(1), path, tree.tokens[path.clamp(min=0)]])
    host = packed.tolist()                      # the step's one host sync
    width = shape.max_depth + 1
    bonus, nodes, tokens = host[0], host[1:1 + width], host[1 + width:]
    length = next((d for d, node in enumerate(nodes) if node < 0), width)
    return Verdict(nodes[:length], tokens[1:length] + [bonus])
