"""Classic speculative decoding: a small model with the target's tokenizer drafts a chain.

In match mode the draft picks each token with the same position-keyed Gumbel noise as the
target, which couples the two and keeps acceptance high; the output equals `ar`'s. In rejection
mode the draft samples from its own distribution, which the chain carries for verification.

How far to draft is decided by measured costs, token by token: one more draft is made while
its expected worth (the chance of the path so far times the draft's chance of its latest
token, in target steps saved) exceeds what it costs (a draft step, as timed, plus what one
more node adds to the target's step: step/sizing.py's StepCost). The chain is scored by the draft's
own chances, so the engine's sizer then verifies the prefix that pays most. Measured on a
2-core CPU, a step of Qwen2.5-Coder-0.5B costs ~0.46 of one of its 1.5B sibling over its draft
vocabulary (`draft_vocab`: chain.py; ~0.58 over the whole) and a 1.5B step over 8 nodes ~2.5 of
one over 1: on 2 cores the 0.5B pays on code, not on prose (docs/benchmarks/speculation.md).
"""

from __future__ import annotations

import itertools
import operator
import time

import torch

from ..cache import StaticCache
from ..step.sizing import Calibration, Sizer, StepCost
from ..step.tree import DraftTree, TreeShape, TrieBuilder
from .base import Budget, TrieDrafter
from .chain import ChainModel
from .registry import MethodSpec, Option

STEP_SMOOTHING = 0.1    # weight of the latest draft step's time in the running estimate
# the draft model drafts over its first this many tokens (chain.py; 0: its whole vocabulary)
DRAFT_VOCAB = 32768
VOCAB_OPTION = {"draft_vocab": Option(DRAFT_VOCAB, minimum=0)}


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


def chance(row: torch.Tensor, token: int) -> float:
    """The probability of `token` under processed logits [1, vocab]."""
    return float(torch.softmax(row[0].float(), -1)[token])


class DraftModelDrafter(TrieDrafter):
    plain_steps = True

    def __init__(self, target, draft, sampler, sizer: Sizer, capacity: int, context: int,
                 vocab: int = DRAFT_VOCAB):
        check_draft_model(target, draft)
        check_draft_context(draft, context, "max_new_tokens or the prompt length")
        self.target = target
        self.sampler = sampler
        self.device = target.device
        # a cache an earlier generation on the draft model left (state/kept_caches.py)
        self.kept = draft.state.kept_caches
        self.kept.ensure_fits(capacity, draft.config.kv_bytes_per_token(draft.dtype.itemsize),
                              draft.device, "the draft model's KV cache", "lower max_new_tokens")
        cache, _ = self.kept.take(capacity) or (
            StaticCache(draft.config, capacity, draft.dtype, draft.device), None)
        self.chain = ChainModel(draft.net, cache, vocab=vocab)
        self.prompt_cache = draft.state.prompt_cache
        # what the draft's chances are worth, as the engine calibrates them, and the target's
        # step costs: the generation's own
        self.trust: Calibration = sizer.calibration
        self.cost: StepCost = sizer.cost
        self.draft_step: float | None = None     # seconds of a draft step, smoothed
        self._start = 0
        self._drafts: list[int] = []

    def prefill(self, prompt_ids: list[int], cache) -> None:
        # the draft model's keys and values of what it saw before, from its own prompt cache
        known = prompt_ids[:-1]
        self.chain.restore(known, self.prompt_cache)
        self.chain.catch_up(known, last_logits=0)
        self.prompt_cache.store(known, self.chain.cache)

    def finish(self, tokens: list[int]) -> None:
        # after `observe`, the cache's slots hold the committed tokens' keys and values only
        self.prompt_cache.store(tokens[:self.chain.fed], self.chain.cache)
        self.kept.give(self.chain.cache, None)

    def _pays(self, cost: StepCost, drafted: int, worth: float) -> bool:
        """Whether a draft more (drafted + 1 of them, a target step over drafted + 2 nodes),
        whose path is accepted with chance `worth`, saves more than it costs; True where the
        costs are not measured yet (the sizer then cuts the chain)."""
        one, now, more = cost.known(1), cost.known(drafted + 1), cost.known(drafted + 2)
        if self.draft_step is None or None in (one, now, more):
            return True
        return worth * one > self.draft_step + more - now

    def draft_chain(self, committed: list[int], budget: Budget, source: int = 0
                    ) -> tuple[list[int], list[torch.Tensor], list[float]]:
        """The chain drafted after `committed`, its processed logits, and each draft's chance
        under the draft model. Drafting goes on while a draft more pays, its chance calibrated
        as the engine calibrates `source`'s."""
        self._start = len(committed)
        adaptive = budget.sizing == "adaptive"
        cost = self.cost
        chances: list[float] = []
        accepted = [1.0]        # the chance of each draft's path, as calibrated
        clock = [time.perf_counter()]

        def go_on(rows: list[torch.Tensor], drafts: list[int]) -> bool:
            now = time.perf_counter()
            if len(drafts) > 1:     # the time since the last draft was one draft step
                step = now - clock[0]
                self.draft_step = (step if self.draft_step is None else
                                   self.draft_step + STEP_SMOOTHING * (step - self.draft_step))
            clock[0] = now
            chances.append(chance(rows[-1], drafts[-1]))
            calibrated = self.trust.chance(source, chances[-1])
            accepted.append(accepted[-1] * calibrated)
            # the next draft's chance taken as this one's
            return not adaptive or self._pays(cost, len(drafts), accepted[-1] * calibrated)

        drafts, rows = self.chain.draft(committed, budget.chain, self.sampler.chain_choice,
                                        go_on=go_on)
        if len(chances) < len(drafts):                 # the last draft, made at the chain's cap
            chances.append(chance(rows[-1], drafts[-1]))
        self._drafts = drafts
        return drafts, rows, chances

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        drafts, rows, chances = self.draft_chain(committed, budget)
        paths = list(itertools.accumulate([1.0, *chances], operator.mul))
        probs = torch.softmax(torch.cat(rows), dim=-1) if self.sampler.rejection else None
        tokens = torch.tensor([committed[-1], *drafts], device=self.device)
        return DraftTree(TreeShape.chain(len(drafts), self.device), tokens, probs, paths,
                         [0] * len(paths))

    def add_drafts(self, trie: TrieBuilder, committed: list[int], budget: Budget,
                   source: int = 0) -> None:
        """Add the chain drafted for the text `committed` to `trie` (used by `auto`)."""
        drafts, _, chances = self.draft_chain(committed, budget, source)
        trie.add_chain(drafts, probs=chances, source=source)

    def observe(self, tree, target_out, verdict) -> None:
        # the cache holds the drafts but the last; keep those the target committed (none when
        # this step drafted nothing: the next draft catches up with the text)
        if not self._drafts:
            return
        kept = 0
        for draft, token in zip(self._drafts[:-1], verdict.tokens):
            if draft != token:
                break
            kept += 1
        self.chain.rewind(self._start + kept)
        self._drafts = []


SPEC = MethodSpec(
    name="draft", summary="a small model with the same tokenizer (classic speculative decoding)",
    budget=Budget(9, 8), draft_model="needed", samples_drafts=True, options=VOCAB_OPTION,
    build=lambda s: DraftModelDrafter(s.model, s.draft_model, s.sampler, s.sizer, s.capacity,
                                      s.context, s.options["draft_vocab"]))
