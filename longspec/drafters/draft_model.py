"""Classic speculative decoding: a small model with the target's tokenizer drafts a chain.

In match mode the draft picks each token with the same position-keyed Gumbel noise as the
target, which couples the two and keeps acceptance high; the output equals `ar`'s. In rejection
mode the draft samples from its own distribution, which the chain carries for verification.
The chain length adapts to recent acceptance within the method's depth budget.
"""

from __future__ import annotations

import torch

from ..cache import StaticCache
from ..memory import ensure_fits
from ..tree import DraftTree
from .base import Budget, Drafter
from .chain import ChainModel
from .registry import MethodSpec

START_GAMMA = 4


def check_draft_model(target, draft) -> None:
    """Raise ValueError unless the draft model can draft for the target."""
    if draft is None:
        raise ValueError("this method needs a draft model: pass draft_model=load_model(PATH) "
                         "(--draft-model PATH; 'demo-draft' for the demo model)")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft.config.vocab_size}) differs from "
                         f"the target's ({target.config.vocab_size}); use a draft with the same "
                         "tokenizer")
    tt, dt = target.tokenizer, draft.tokenizer
    if tt is not None and dt is not None and tt.get_vocab() != dt.get_vocab():
        raise ValueError("the draft model's tokenizer differs from the target's; use a draft "
                         "with the same tokenizer")
    if draft.device != target.device:
        raise ValueError(f"the draft model is on {draft.device}, the target on {target.device}")


def check_draft_context(draft, positions: int, fix: str) -> None:
    """Raise ValueError when the draft model would see positions past its context."""
    if draft.config.context_limit < positions:
        raise ValueError(f"the draft model's context ({draft.config.context_limit} positions) is "
                         f"shorter than the {positions} it would need here; lower {fix}")


class AdaptiveGamma:
    """Chain length: one longer after a fully accepted chain, one shorter otherwise."""

    def __init__(self, start: int = START_GAMMA):
        self.value = start

    def get(self, limit: int) -> int:
        return max(1, min(self.value, limit))

    def update(self, drafted: int, accepted: int, limit: int) -> None:
        self.value = min(limit, drafted + 1) if accepted == drafted else max(1, drafted - 1)


class DraftModelDrafter(Drafter):
    def __init__(self, target, draft, sampler, capacity: int, context: int):
        check_draft_model(target, draft)
        check_draft_context(draft, context, "max_new_tokens or the prompt length")
        self.sampler = sampler
        self.device = target.device
        ensure_fits(capacity * draft.config.kv_bytes_per_token(draft.dtype.itemsize), draft.device,
                    "the draft model's KV cache", "lower max_new_tokens")
        cache = StaticCache(draft.config, capacity, draft.dtype, draft.device)
        self.chain = ChainModel(draft.net, cache)
        self.gamma = AdaptiveGamma()
        self._start = 0
        self._limit = 1

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.chain.catch_up(prompt_ids[:-1], last_logits=0)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        gamma = self.gamma.get(budget.chain)
        self._start = len(committed)
        self._limit = budget.chain
        drafts, rows = self.chain.draft(committed, gamma, self.sampler.chain_choice)
        probs = torch.softmax(torch.cat(rows), dim=-1) if self.sampler.rejection else None
        return DraftTree.chain([committed[-1], *drafts], self.device, probs)

    def observe(self, tree, target_out, verdict) -> None:
        drafted = tree.n - 1
        accepted = verdict.accept_length
        # the cache holds the drafts but the last; keep those the target accepted
        self.chain.rewind(self._start + min(accepted, drafted - 1))
        self.gamma.update(drafted, accepted, self._limit)


SPEC = MethodSpec(
    name="draft", summary="a small model with the same tokenizer (classic speculative decoding)",
    budget=Budget(9, 8), needs_draft_model=True, samples_drafts=True,
    build=lambda s: DraftModelDrafter(s.model, s.draft_model, s.sampler, s.capacity, s.context))
