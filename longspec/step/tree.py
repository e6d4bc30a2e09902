"""Draft trees: tokens in a trie rooted at the last committed token.

A `TreeShape` is the structure alone (parents, depths and the buffers derived from them: the
ancestor mask, root-to-node paths). Chains share one memoised shape per length; static
templates (`TreeTemplate`) build their shape once and only swap tokens; drafters that merge
sources build a trie (`TrieBuilder`). Nodes are numbered so that a parent always comes before
its children; node 0 is the root.
"""

from __future__ import annotations

import functools
import heapq
from enum import IntEnum

import torch

from ..device.memory import upload


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
        # built on the host, then uploaded in one copy (no host sync on a GPU)
        parent_t = torch.tensor([max(p, 0) for p in parents])
        depth_t = torch.tensor(depths)
        idx = torch.arange(n)
        ancestors = torch.zeros(n, n, dtype=torch.long)
        paths = torch.full((n, self.max_depth + 1), -1, dtype=torch.long)
        cur = idx
        for step in range(self.max_depth + 1):
            at = depth_t - step
            valid = at >= 0
            ancestors[idx[valid], cur[valid]] = 1
            paths[idx[valid], at[valid]] = cur[valid]
            cur = parent_t[cur]
        packed = upload(torch.cat([parent_t, depth_t, ancestors.view(-1), paths.view(-1)]), device)
        self.parent, self.depth, ancestors, packed_paths = packed.split(
            [n, n, n * n, paths.numel()])
        self.ancestors = ancestors.view(n, n).bool()
        self.host_paths = paths                 # on the host (a captured step's layout)
        self.paths = packed_paths.view(n, self.max_depth + 1)
        self._masks: dict[torch.dtype, torch.Tensor] = {}

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive [n, n] attention mask (0 on ancestors, -inf elsewhere); None for a lone root."""
        if self.n == 1:
            return None
        if dtype not in self._masks:
            m = torch.zeros(self.n, self.n, dtype=dtype, device=self.device)
            self._masks[dtype] = m.masked_fill_(~self.ancestors, float("-inf"))
        return self._masks[dtype]

    @staticmethod
    @functools.cache
    def chain(length: int, device: torch.device) -> TreeShape:
        """The root followed by a chain of `length` nodes (the root alone for 0), built once
        per length and device."""
        return TreeShape([-1] + list(range(length)), device)

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def of(parents: tuple[int, ...], device: torch.device) -> TreeShape:
        """The shape with these parents, built once per structure (drafts repeat shapes)."""
        return TreeShape(list(parents), device)


class DraftTree:
    """A tree shape with tokens on its nodes (tokens[0] is the root).

    A chain drafted by sampling may carry `draft_probs` [n - 1, vocab], the distribution each
    draft came from. A scored tree carries, per node, `scores`: the drafter's estimate that
    the node's whole path is accepted (the root's is 1; a child's is at most its parent's),
    and `sources`: which of the drafter's sources proposed it (for calibrating each source's
    estimates apart).
    """

    def __init__(self, shape: TreeShape, tokens: torch.Tensor,
                 draft_probs: torch.Tensor | None = None, scores: list[float] | None = None,
                 sources: list[int] | None = None):
        if tokens.shape != (shape.n,):
            raise ValueError(f"{tokens.shape[0]} tokens for a tree of {shape.n} nodes")
        self.shape = shape
        self.tokens = tokens
        self.draft_probs = draft_probs
        self.scores = scores
        self.sources = sources

    @property
    def n(self) -> int:
        return self.shape.n

    @classmethod
    def chain(cls, tokens: list[int], device: torch.device,
              draft_probs: torch.Tensor | None = None) -> DraftTree:
        """The root tokens[0] followed by the drafts tokens[1:]."""
        shape = TreeShape.chain(len(tokens) - 1, device)
        return cls(shape, torch.tensor(tokens, device=device), draft_probs)


class Source(IntEnum):
    """Where a draft node came from: the id each node carries (DraftTree.sources), by which the
    sizer calibrates each source's acceptance apart and `auto` reports it (its SOURCES: these
    names). A drafter of one source marks its nodes 0; TokenSwift numbers its three from 0; the
    tokens a grammar forces are GRAMMAR under every method."""

    SUFFIX = 0            # the generation's own text (suffix decoding)
    SUFFIX_EARLIER = 1    # earlier outputs on the model (the shared suffix index)
    PREDICTION = 2        # the request's predicted output
    RECYCLING = 3         # Token Recycling's adjacency table
    EAGLE = 4             # an EAGLE drafter's tree
    DRAFT_MODEL = 5       # a draft model's chain
    GRAMMAR = 6           # the tokens a grammar forces (grammar.graft)

# Tries of scored candidates hold this many times the nodes a step may verify: the engine
# keeps the best of them (step/sizing.py).
CANDIDATES = 2


class TrieBuilder:
    """Merges chains and trees from several sources into one trie: identical prefixes become
    one node, so no token is verified twice and at most one child of a node can match.

    Each added token may come with `prob`, the source's estimate that it follows its parent;
    a node's score is the product along its path (the best over the sources that proposed
    it), and its source the one that gave that score.
    """

    def __init__(self, root: int, max_nodes: int, max_depth: int):
        self.tokens = [root]
        self.parents = [-1]
        self.depths = [0]
        self.scores = [1.0]
        self.sources = [0]
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self._children: dict[tuple[int, int], int] = {}   # (parent node, token) -> node

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.max_nodes

    def child(self, parent: int, token: int, prob: float = 1.0, source: int = 0) -> int | None:
        """The node for `token` under `parent`, added if new; None when over budget."""
        key = (parent, token)
        score = self.scores[parent] * prob
        node = self._children.get(key)
        if node is not None:
            if score > self.scores[node]:
                self.scores[node], self.sources[node] = score, source
            return node
        if self.full or self.depths[parent] >= self.max_depth:
            return None
        node = len(self.tokens)
        self._children[key] = node
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        self.sources.append(source)
        return node

    def add_chain(self, tokens: list[int], parent: int = 0, probs: list[float] | None = None,
                  source: int = 0) -> None:
        """Add a chain of tokens below `parent` (default: the root), each with the source's
        estimate that it follows the one before."""
        for i, token in enumerate(tokens):
            parent = self.child(parent, token, 1.0 if probs is None else probs[i], source)
            if parent is None:
                return

    def add_tree(self, parents: list[int], tokens: list[int], parent: int = 0,
                 probs: list[float] | None = None, source: int = 0) -> None:
        """Add a tree given in parent order (parents[i] < i, -1 for nodes hanging off
        `parent`), each token with the estimate that it follows its parent."""
        placed: list[int | None] = []
        for i, (p, token) in enumerate(zip(parents, tokens)):
            anchor = parent if p < 0 else placed[p]
            prob = 1.0 if probs is None else probs[i]
            placed.append(None if anchor is None else self.child(anchor, token, prob, source))

    def build(self, device: torch.device) -> DraftTree:
        shape = TreeShape.of(tuple(self.parents), device)
        return DraftTree(shape, upload(self.tokens, device), scores=self.scores,
                         sources=self.sources)


# Assumed chance that the candidate of rank r is the target's next token: a best-first tree
# under these weights gives higher-ranked nodes more children, as in Token Recycling's template.
RANK_WEIGHTS = (0.45, 0.15, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)


def template(max_nodes: int, max_depth: int, width: int = len(RANK_WEIGHTS)
             ) -> tuple[list[int], list[int]]:
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


class TreeTemplate:
    """A static tree of ranked candidates: each node is the rank-r candidate below its parent.
    Filling it is one gather per level, with no host work."""

    def __init__(self, max_nodes: int, max_depth: int, device: torch.device,
                 width: int = len(RANK_WEIGHTS)):
        parents, ranks = template(max_nodes, max_depth, width)
        self.shape = TreeShape(parents, device)
        self.parents = parents
        self.ranks = ranks
        # the assumed chance of each node's path, for sizing (calibrated by observation)
        self.scores = [1.0] * len(parents)
        for i in range(1, len(parents)):
            self.scores[i] = self.scores[parents[i]] * RANK_WEIGHTS[ranks[i]]
        depths = self.shape.depths
        self.levels = []        # per depth 1..: (nodes, their parents, their ranks)
        for d in range(1, self.shape.max_depth + 1):
            nodes = [i for i in range(len(parents)) if depths[i] == d]
            self.levels.append((torch.tensor(nodes, device=device),
                                torch.tensor([parents[i] for i in nodes], device=device),
                                torch.tensor([ranks[i] for i in nodes], device=device)))

    def fill_by_token(self, root: int, successors: torch.Tensor) -> torch.Tensor:
        """Tokens [n]: a node's children are its token's ranked successors [vocab, width]."""
        tokens = torch.empty(self.shape.n, dtype=torch.long, device=successors.device)
        tokens[0] = root
        for nodes, parents, ranks in self.levels:
            tokens[nodes] = successors[tokens[parents], ranks]
        return tokens

    def fill_by_depth(self, root: int, candidates: torch.Tensor) -> torch.Tensor:
        """Tokens [n]: every node at depth d is a candidate [depth, width] of that depth (for
        drafters, like multi-token heads, whose guesses do not depend on the path)."""
        tokens = torch.empty(self.shape.n, dtype=torch.long, device=candidates.device)
        tokens[0] = root
        for level, (nodes, _, ranks) in enumerate(self.levels):
            tokens[nodes] = candidates[level, ranks]
        return tokens
