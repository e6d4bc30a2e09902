"""Draft trees: tokens in a trie rooted at the last committed token.

A `TreeShape` is the structure alone (parents, depths and the buffers derived from them: the
ancestor mask, root-to-node paths). Static templates build their shape once and only swap tokens.
Nodes are numbered so that a parent always comes before its children; node 0 is the root.
"""

from __future__ import annotations

import torch


class TreeShape:
    """Parents and depths of a draft tree, with derived device buffers.

    ancestors [n, n] bool: ancestors[i, j] when node j is on the path root..i (i included).
    paths [n, max_depth + 1] long: paths[i, d] is the node at depth d on the way to i, -1 past i.
    """

    def __init__(self, parents: list[int], device: torch.device):
        n = len(parents)
        if n == 0 or parents[0] != -1:
            raise ValueError("a draft tree starts with its root (parent -1)")
        depths = [0] * n
        for i in range(1, n):
            if not 0 <= parents[i] < i:
                raise ValueError(f"node {i} has parent {parents[i]}: parents must come first")
            depths[i] = depths[parents[i]] + 1
        self.n = n
        self.parents = parents
        self.depths = depths
        self.max_depth = max(depths)
        self.device = device
        parent_t = torch.tensor([max(p, 0) for p in parents], device=device)
        self.parent = parent_t
        self.depth = torch.tensor(depths, device=device)
        idx = torch.arange(n, device=device)
        self.ancestors = torch.zeros(n, n, dtype=torch.bool, device=device)
        self.paths = torch.full((n, self.max_depth + 1), -1, dtype=torch.long, device=device)
        cur = idx
        for step in range(self.max_depth + 1):
            at = self.depth - step
            valid = at >= 0
            self.ancestors[idx[valid], cur[valid]] = True
            self.paths[idx[valid], at[valid]] = cur[valid]
            cur = parent_t[cur]
        self._masks: dict[torch.dtype, torch.Tensor] = {}

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive [n, n] attention mask (0 on ancestors, -inf elsewhere); None for a lone root."""
        if self.n == 1:
            return None
        if dtype not in self._masks:
            m = torch.zeros(self.n, self.n, dtype=dtype, device=self.device)
            self._masks[dtype] = m.masked_fill_(~self.ancestors, float("-inf"))
        return self._masks[dtype]

    @classmethod
    def chain(cls, length: int, device: torch.device) -> TreeShape:
        """Root followed by a chain of `length` nodes."""
        return cls([-1] + list(range(length)), device)


class DraftTree:
    """A tree shape with tokens on its nodes (tokens[0] is the root). A chain drafted by
    sampling may carry `draft_probs` [n - 1, vocab], the distribution each draft came from."""

    def __init__(self, shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None):
        if tokens.shape != (shape.n,):
            raise ValueError(f"{tokens.shape[0]} tokens for a tree of {shape.n} nodes")
        self.shape = shape
        self.tokens = tokens
        self.draft_probs = draft_probs

    @property
    def n(self) -> int:
        return self.shape.n


class TrieBuilder:
    """Merges chains and trees from several drafters into one trie: identical prefixes become
    one node, so no token is verified twice and at most one child of a node can match."""

    def __init__(self, root: int, max_nodes: int, max_depth: int):
        self.tokens = [root]
        self.parents = [-1]
        self.depths = [0]
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self._children: dict[tuple[int, int], int] = {}   # (parent node, token) -> node

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.max_nodes

    def child(self, parent: int, token: int) -> int | None:
        """The node for `token` under `parent`, added if new; None when over budget."""
        key = (parent, token)
        node = self._children.get(key)
        if node is not None:
            return node
        if self.full or self.depths[parent] >= self.max_depth:
            return None
        node = len(self.tokens)
        self._children[key] = node
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        return node

    def add_chain(self, tokens: list[int], parent: int = 0) -> None:
        """Add a chain of tokens below `parent` (default: the root)."""
        for token in tokens:
            parent = self.child(parent, token)
            if parent is None:
                return

    def add_tree(self, parents: list[int], tokens: list[int], parent: int = 0) -> None:
        """Add a tree given in parent order (parents[i] < i, -1 for nodes hanging off `parent`)."""
        placed: list[int | None] = []
        for p, token in zip(parents, tokens):
            anchor = parent if p < 0 else placed[p]
            placed.append(None if anchor is None else self.child(anchor, token))

    def build(self, device: torch.device) -> DraftTree:
        shape = TreeShape(self.parents, device)
        return DraftTree(shape, torch.tensor(self.tokens, device=device))
