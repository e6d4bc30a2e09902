"""TriForce: hierarchical speculation.

A tiny draft model over a StreamingLLM cache drafts gamma1 tokens; the target over a retrieval
cache verifies them (the middle level) and its accepted tokens plus its own bonus token join the
collection; this repeats until gamma2 tokens are collected, which the target then verifies with
its full cache. Match mode uses the position-keyed choice at every level. In rejection mode the
middle level is itself speculative sampling (tiny q against the retrieval target p'), resampling
from the residual on rejection, so the collected tokens are samples of p' and carry p' as their
draft distribution into the final verification.
"""

from __future__ import annotations

import torch

from ..cache.streaming import StreamingCache
from ..step.tree import DraftTree
from ..step.verify import speculative_sample, verify_tree
from .base import Budget, Drafter
from .chain import ChainModel
from .draft_model import DRAFT_VOCAB, VOCAB_OPTION, check_draft_context, check_draft_model
from .registry import MethodSpec, Option
from .retrieval_level import LEVEL_OPTIONS, RetrievalLevel

GAMMA1 = 4
STREAMING_WINDOW = 512


class TriForceDrafter(Drafter):
    def __init__(self, target, draft, sampler, budget: int, rebuild_every: int,
                 max_depth: int, *, gamma1: int = GAMMA1, window: int = STREAMING_WINDOW,
                 vocab: int = DRAFT_VOCAB):
        check_draft_model(target, draft)
        self.sampler = sampler
        self.device = target.device
        self.gamma1 = gamma1
        slack = max_depth + gamma1 + 2
        self.level = RetrievalLevel(target, budget, rebuild_every, slack)
        # room for a window-sized prefill piece on top of a full window
        tiny_cache = StreamingCache(draft.config, window, window + slack, draft.dtype,
                                    draft.device, draft.net.rotate_keys)
        check_draft_context(draft, tiny_cache.capacity, "streaming_window")
        self.tiny = ChainModel(draft.net, tiny_cache, slot_positions=True, vocab=vocab)
        self.middle_drafted = 0
        self.middle_accepted = 0

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.level.attach(cache)
        for start in range(0, len(prompt_ids) - 1, self.tiny.cache.window):
            self.tiny.catch_up(prompt_ids[:min(start + self.tiny.cache.window,
                                               len(prompt_ids) - 1)],
                               last_logits=0)
            self.tiny.cache.trim()

    def middle_step(self, sequence: list[int], collected: list[int], gamma1: int
                    ) -> tuple[list[int], torch.Tensor]:
        """Tiny drafts gamma1 tokens after `sequence`; the retrieval target verifies them.
        Returns the new tokens (accepted drafts + one more) and p' [len(new), vocab]."""
        sampler, mid = self.sampler, self.level.chain
        drafts, rows = self.tiny.draft(sequence, gamma1, sampler.chain_choice, ahead=len(collected))
        start = mid.fed
        logits = mid.feed(sequence[start:] + drafts, last_logits=gamma1 + 1)
        tree = DraftTree.chain([sequence[-1], *drafts], self.device)
        processed, choices = sampler.tree_choices(tree, logits, ahead=collected)
        mid_probs = torch.softmax(processed, dim=-1)
        if sampler.rejection:
            draft_probs = torch.softmax(torch.cat(rows), dim=-1)
            k, token = speculative_sample(mid_probs, draft_probs, tree.tokens[1:], sampler)
            k, token = torch.stack([k, token]).tolist()
            new = drafts[:k] + [token]
        else:
            new = verify_tree(tree, choices).tokens
            k = len(new) - 1
        mid.rewind(len(sequence) + k)     # keep the sequence's and the accepted drafts' keys
        self.tiny.rewind(len(sequence) + min(k, gamma1 - 1))
        self.middle_drafted += gamma1
        self.middle_accepted += k
        return new, mid_probs[:k + 1]

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        """The middle level's collected tokens; while the retrieval cache holds the whole
        context (the middle level would be the target itself), the tiny model's chain."""
        self.level.sync(committed)
        self._start = len(committed)
        gamma2 = budget.chain
        if self.level.cache.complete:
            drafts, rows = self.tiny.draft(committed, gamma2, self.sampler.chain_choice)
            probs = torch.softmax(torch.cat(rows), dim=-1) if self.sampler.rejection else None
            return DraftTree.chain([committed[-1], *drafts], self.device, probs)
        collected: list[int] = []
        probs: list[torch.Tensor] = []
        while len(collected) < gamma2:
            gamma1 = min(self.gamma1, gamma2 - len(collected))
            new, mid_probs = self.middle_step(committed + collected, collected, gamma1)
            collected += new
            probs.append(mid_probs)
        collected = collected[:gamma2]
        draft_probs = torch.cat(probs)[:gamma2] if self.sampler.rejection else None
        return DraftTree.chain([committed[-1], *collected], self.device, draft_probs)

    def observe(self, tree, target_out, verdict) -> None:
        accepted = verdict.accept_length
        self.level.settle(len(verdict.tokens), tree.n - 1, accepted)
        self.tiny.rewind(min(self.tiny.fed, self._start + accepted))
        self.tiny.cache.trim()

    def stats(self) -> dict:
        drafted = self.middle_drafted
        return {"middle_acceptance_rate": self.middle_accepted / drafted if drafted else 0.0,
                "retrieval_rebuilds": self.level.rebuilds}


SPEC = MethodSpec(
    name="triforce", summary="a small model over a StreamingLLM cache -> the target over a "
    "retrieval cache -> full target",
    budget=Budget(13, 12), draft_model="needed", samples_drafts=True,
    options={**LEVEL_OPTIONS, "gamma1": Option(GAMMA1),
             "streaming_window": Option(STREAMING_WINDOW), **VOCAB_OPTION},
    stats=("middle_acceptance_rate", "retrieval_rebuilds"),
    build=lambda s: TriForceDrafter(s.model, s.draft_model, s.sampler,
                                    s.options["retrieval_budget"], s.options["rebuild_every"],
                                    s.budget.max_depth, gamma1=s.options["gamma1"],
                                    window=s.options["streaming_window"],
                                    vocab=s.options["draft_vocab"]))
