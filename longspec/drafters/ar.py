"""Plain autoregressive decoding: the baseline every method must equal, with the same kernels."""

from __future__ import annotations

from ..step.tree import DraftTree
from .base import Budget, Drafter
from .registry import MethodSpec


class NoDraft(Drafter):
    """The tree is the root alone."""
    plain_steps = True

    def __init__(self, device):
        self.device = device

    def propose(self, committed, budget) -> DraftTree:
        return DraftTree.chain(committed[-1:], self.device)


SPEC = MethodSpec(
    name="ar", summary="nothing: plain decoding, the baseline, same kernels",
    budget=Budget(1, 0), build=lambda setup: NoDraft(setup.model.device))
