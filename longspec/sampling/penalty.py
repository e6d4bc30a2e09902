"""The contextual penalty's window, kept as token counts and extended along draft-tree paths.

The logits that predict position P are penalised on the tokens among positions [P - W, P).
For a draft-tree node at depth d (root: depth 0, the last committed token) that window is the
committed window slid forward by d tokens: the node's own path enters it and the oldest
committed tokens leave it. Counts (not presence) make the sliding exact.
"""

from __future__ import annotations

import torch

from ..device.memory import upload
from ..step.tree import DraftTree


class PenaltyWindow:
    """Counts [vocab] of the tokens in the last `window` committed positions."""

    def __init__(self, window: int, vocab_size: int, device: torch.device):
        self.window = window
        self.device = device
        self.counts = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        self.tokens: list[int] = []   # every committed token, prompt included

    def _add(self, tokens: list[int], sign: int) -> None:
        if tokens:
            idx = upload(tokens, self.device)
            self.counts.index_add_(0, idx, torch.full((len(tokens),), sign, dtype=torch.int32,
                                                      device=self.device))

    def extend(self, tokens: list[int]) -> None:
        """Commit tokens: they enter the window and the oldest leave it."""
        old_len = len(self.tokens)
        old_start = max(0, old_len - self.window)
        self.tokens.extend(tokens)
        new_start = max(0, len(self.tokens) - self.window)
        self._add(self.tokens[old_start:min(new_start, old_len)], -1)
        self._add(self.tokens[max(new_start, old_len):], 1)

    def presence(self, tree: DraftTree) -> torch.Tensor:
        """Tokens present [n, vocab] in the window of each node of `tree`."""
        return self.tree_counts(tree) > 0

    def tree_counts(self, tree: DraftTree) -> torch.Tensor:
        """Counts [n, vocab] of the tokens in the window of each node of `tree`."""
        shape = tree.shape
        if shape.n == 1:
            return self.counts[None]
        counts = self.counts.expand(shape.n, -1).clone()
        # path tokens at depth a (1..d) are in the window of a node at depth d when a > d - W
        path = shape.paths[:, 1:]                       # the root is already committed
        path_depth = torch.arange(1, shape.max_depth + 1, device=self.device)
        in_window = (path >= 0) & (path_depth[None, :] > shape.depth[:, None] - self.window)
        counts.scatter_add_(1, tree.tokens[path.clamp(min=0)], in_window.int())
        length = len(self.tokens)
        start = max(0, length - self.window)
        leaving = self.tokens[start:start + shape.max_depth]
        if length + shape.max_depth > self.window and leaving:
            # a node at depth d keeps the committed tokens from max(0, length + d - W) on
            slid = (shape.depth + (length - self.window)).clamp(min=0, max=length) - start
            k = torch.arange(len(leaving), device=self.device)
            drop = (k[None, :] < slid[:, None]).int()
            leave = upload(leaving, self.device).expand(shape.n, -1)
            counts.scatter_add_(1, leave, -drop)
        return counts

    def presence_after(self, path: list[int]) -> torch.Tensor:
        """Tokens present [1, vocab] in the window of the position after committed + path."""
        return self.counts_after(path) > 0

    def counts_after(self, path: list[int]) -> torch.Tensor:
        """Counts [1, vocab] of the tokens in the window of the position after committed +
        path."""
        if not path:
            return self.counts[None]
        counts = self.counts.clone()
        counts.index_add_(0, upload(path[-self.window:], self.device),
                          torch.ones(min(len(path), self.window), dtype=torch.int32,
                                     device=self.device))
        length = len(self.tokens)
        start = max(0, length - self.window)
        keep_from = min(max(0, length + len(path) - self.window), length)
        if keep_from > start:
            gone = upload(self.tokens[start:keep_from], self.device)
            counts.index_add_(0, gone, -torch.ones_like(gone, dtype=torch.int32))
        return counts[None]

    def extended(self, ahead: list[int]) -> PenaltyWindow:
        """A copy that has also committed `ahead` (costs one counts copy and the window)."""
        view = PenaltyWindow.__new__(PenaltyWindow)
        view.window, view.device = self.window, self.device
        view.counts = self.counts.clone()
        view.tokens = self.tokens[-self.window:]   # only the window matters from here on
        view.extend(ahead)
        return view
