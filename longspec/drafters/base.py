"""The Drafter protocol: what the engine asks of every source of draft tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..step.forward import ForwardOutput
from ..step.tree import CANDIDATES, DraftTree, TrieBuilder
from ..step.verify import TargetOutput, Verdict

SIZINGS = ("adaptive", "fixed")


@dataclass(frozen=True)
class Budget:
    max_nodes: int   # nodes of a draft tree, root included
    max_depth: int   # draft tokens along any path
    # "adaptive": a scored tree is cut to the size that pays most (step/sizing.py); "fixed": to its
    # max_nodes best nodes by the drafter's own scores (ablations, and tests that want drafts)
    sizing: str = SIZINGS[0]

    @property
    def chain(self) -> int:
        """Longest chain that fits both limits."""
        return min(self.max_depth, self.max_nodes - 1)


class Drafter(ABC):
    """Base of every drafter: the engine's calls, with do-nothing defaults but `propose`."""

    needs_hidden = False          # the verify forward should return hidden states
    needs_prefill_logits = False  # prefill should compute logits for every prompt position
    # the drafter stays right when a batch takes a plain step without asking it (`plain_step`,
    # then `observe` of a lone root it did not propose): its state catches up from the text
    plain_steps = False

    def observe_prefill(self, tokens: torch.Tensor, out: ForwardOutput) -> None:
        """The target's output for a prefill chunk: logits [c, vocab] after each token when
        needs_prefill_logits, hidden states when needs_hidden."""

    def prefill(self, prompt_ids: list[int], cache) -> None:
        """Called once after the prompt (all but its last token) is in the target's full
        `cache`, which drafters that read the target's keys keep a reference to."""

    @abstractmethod
    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        """A draft tree rooted at committed[-1]."""

    def propose_if_sure(self, committed: list[int], budget: Budget) -> DraftTree | None:
        """In a step a batch takes plain (where `plain_steps`): a tree the drafter is sure
        enough of to pay there too, or None (the default), and the step is plain for it
        (`plain_step` follows)."""
        return None

    def plain_step(self) -> None:
        """This step is a plain one, taken without `propose` (where `plain_steps`)."""

    def observe(self, tree: DraftTree, target_out: TargetOutput, verdict: Verdict) -> None:
        """Learn from a verify step (called with the committed part of the verdict)."""

    def finish(self, tokens: list[int]) -> None:
        """The generation ended with the sequence `tokens` (prompt included); drafters that
        learn across generations keep what they learned."""

    def stats(self) -> dict:
        """Method-specific statistics for the result's stats."""
        return {}


class TrieDrafter(Drafter):
    """A drafter that adds its drafts to a trie, its own or one shared with other sources
    (`auto` merges several); subclasses set `self.device`."""

    device: torch.device

    @abstractmethod
    def add_drafts(self, trie: TrieBuilder, committed: list[int], budget: Budget) -> None:
        """Add drafts for the text `committed` to `trie`."""

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        self.add_drafts(trie, committed, budget)
        return trie.build(self.device)
