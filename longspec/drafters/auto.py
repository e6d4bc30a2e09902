"""`auto`: every draft source the model has, merged into one scored trie.

Model-free sources always: SuffixDecoding's matches in this text, in a predicted output
(prediction=) and in earlier outputs, and Token Recycling's adjacency matrix of the target's
own candidates. In the steps where the
suffix matches are unsure of the next token (MODELS_BELOW), the sources that run a model: a
trained EAGLE drafter's dynamic tree, when the model has one (bundled for it, trained for it
on this machine, or given as heads=; option drafter="none" leaves a found one out), and a
draft model's chain, when one is given (draft_model=), as long as such steps measure faster
with them than without (StepRates). Each node keeps the source whose estimate
was best; the engine calibrates each source's estimates from what the target accepts and
verifies the prefix of the trie that pays most (step/sizing.py), so a source that guesses badly on
this text is simply cut away. Where no source pays at all (sampling at T=1 without a filter),
drafting itself is measured against plain steps and left out while it loses (StepRates), except
in steps where the suffix matches are sure of the next token (SURE_SUFFIX); option gate="off"
drafts every step instead (the equality tests, which must see drafts verified).
"""

from __future__ import annotations

import time

from ..heads import store
from ..step.sizing import Sizer
from ..step.tree import CANDIDATES, DraftTree, Source, TrieBuilder
from .base import Budget, Drafter
from .draft_model import SPEC as DRAFT_SPEC
from .draft_model import DraftModelDrafter
from .eagle import EagleDrafter
from .recycling import RecyclingDrafter
from .registry import MethodSpec, Option
from .suffix import SuffixDrafter

SOURCES = tuple(source.name.lower() for source in Source)   # by the ids nodes carry
SPEC_NAME = "auto"
RECYCLING_BUDGET = Budget(32, 6)    # the recycling template within the merged trie
EAGLE_BUDGET = Budget(32, 6)        # the EAGLE drafter's tree within it (its method's default)
DRAFT_MODEL_BUDGET = DRAFT_SPEC.budget   # the draft model's chain within it (`draft`'s default)
# The EAGLE drafter and the draft model draft only in a step where the suffix matches'
# likeliest next token has a calibrated chance below this: where they are surer, the few tokens
# more rarely paid for the forwards (SmolLM2, 3 chat prompts: `auto` with the EAGLE drafter ran
# 0.77x `auto` without it greedy and 0.68x at T=0.7 when it drafted every step, 0.97-0.99x
# and 0.90-0.95x with 0.3; docs/benchmarks/speculation.md). The steps they skip reach their caches
# in one forward when they next draft.
MODELS_BELOW = 0.3
RATE_SMOOTHING = 0.1    # weight of a step in its arm's running tokens and seconds (StepRates)
EXPLORE_EVERY = 16      # steps after which the arm not chosen is tried again (StepRates),
EXPLORE_MOST = 64       # twice as many each time it lost again, up to this many
# A step the gate would take plain drafts anyway where the suffix matches' likeliest next token
# has at least this calibrated chance (their lookup costs ~0.06 ms): drafts pay in stretches
# where the text repeats, which a drafting step every EXPLORE_EVERY finds late.
SURE_SUFFIX = 0.5
# "measured": drafting steps against plain ones, as above; "off": a drafting step every step
GATES = ("measured", "off")
# the EAGLE drafter when none is given: the one found for the model (bundled, or trained on
# this machine: heads/store.py), or none
DRAFTERS = ("found", "none")


class StepRates:
    """Which of two ways of taking a step pays (arms True and False), as measured: each arm's
    new tokens over its seconds (drafting, verifying, choosing), both decayed so that they follow
    the text. The faster arm is chosen; an arm in `retried` is tried again after EXPLORE_EVERY
    steps without it, after twice as many each time the try left it slower still (up to
    EXPLORE_MOST: on 2 cores a drafting step of 8 SmolLM2 answers at T=1 cost about two plain
    ones, so trying it every 16 steps cost the batch ~6%), and each arm is tried first while it
    has no measure. With a `budget`, the arms not retried are measured first, and a try also
    waits until the seconds the tries lost (each try's seconds past what the faster arm took for
    its tokens) are at most that share of every step's seconds: a try that costs three plain
    steps waits longer than one that costs 1.2."""

    def __init__(self, retried: tuple[bool, ...] = (True, False), budget: float | None = None):
        self.retried = retried
        self.budget = budget
        self.tokens = {True: 0.0, False: 0.0}
        self.seconds = {True: 0.0, False: 0.0}
        self.waited = {True: 0, False: 0}    # steps since the arm was last taken
        self.every = {True: EXPLORE_EVERY, False: EXPLORE_EVERY}    # ... before it is tried
        self.lost = 0.0         # seconds the tries lost against the faster arm (with a budget)
        self.spent = 0.0        # seconds of every step recorded

    def choose(self) -> bool:
        for arm in (True, False):
            if arm in self.retried and self._due(arm):
                return arm
            if self.seconds[arm] == 0 and (self.budget is None or arm not in self.retried):
                return arm
        return self._faster()

    def _faster(self) -> bool:
        """The arm that took fewer seconds a token, or the one measured if one is not."""
        if self.seconds[True] == 0 or self.seconds[False] == 0:
            return self.seconds[True] > 0
        return self.tokens[True] * self.seconds[False] >= self.tokens[False] * self.seconds[True]

    def _due(self, arm: bool) -> bool:
        return self.waited[arm] >= self.every[arm] and (
            self.budget is None or self.lost <= self.budget * self.spent)

    def record(self, arm: bool, tokens: int, seconds: float) -> None:
        other = not arm
        if self.budget is not None and self.tokens[other] > 0 and self._faster() != arm:
            rate = self.tokens[other] / self.seconds[other]
            self.lost += max(0.0, seconds - tokens / rate)
        self.spent += seconds
        keep = 1 - RATE_SMOOTHING
        self.tokens[arm] = keep * self.tokens[arm] + tokens
        self.seconds[arm] = keep * self.seconds[arm] + seconds
        self.waited[arm] = 0
        self.waited[not arm] += 1
        if self.seconds[not arm] > 0:
            lost = self._faster() != arm
            self.every[arm] = min(2 * self.every[arm], EXPLORE_MOST) if lost else EXPLORE_EVERY


class AutoDrafter(Drafter):
    # Token Recycling's matrix is not seeded from the prompt's logits here (`recycling` alone
    # seeds it): on SmolLM2's 8 chat prompts, 512 tokens, `auto` ran 1.01x as fast without the
    # seeding greedy and at T=0.7, while the logits of every prompt position cost 18% more
    # prefill over 24 ShareGPT prompts (the LM head is a fifth of SmolLM2)
    plain_steps = True

    def __init__(self, model, sampler, sizer: Sizer, drafter, context: int, draft_model=None,
                 capacity: int = 0, *, gate: str = GATES[0], found: str = DRAFTERS[0],
                 prediction: tuple[int, ...] = ()):
        """`sizer`: the generation's (its step costs and calibration); `drafter`: an EAGLE
        drafter's directory (or loaded one), or None for the one found for the model (`found`,
        one of DRAFTERS), when there is; `draft_model`: a draft model, or None, and `capacity`
        the slots its KV cache needs; `gate`: one of GATES."""
        self.device = model.device
        self.model = model
        self.trust = sizer.calibration
        self.suffix = SuffixDrafter(model, model.device, prediction)
        self.recycling = RecyclingDrafter(model)
        if drafter is None and found == "found":
            drafter = store.find_bundled(model, "eagle")
        self.eagle = (None if drafter is None else
                      EagleDrafter(model, drafter, sampler, self.trust, context, EAGLE_BUDGET))
        self.draft_model = (None if draft_model is None else
                            DraftModelDrafter(model, draft_model, sampler, sizer, capacity,
                                              context))
        self.needs_hidden = self.eagle is not None
        # drafting at all (True) or a plain step (False): where no draft pays (sampling at T=1
        # without a filter: `auto` on SmolLM2 ran 0.80-0.99x `ar` drafting every step), plain
        # steps, with a drafting step every EXPLORE_EVERY; where drafts pay, no forced plain one
        # (None: gate "off", every step drafts)
        self.gate = StepRates(retried=(True,)) if gate == "measured" else None
        self.rates = StepRates()     # in unsure steps: with the sources that run a model or not
        self.drafting: bool | None = True    # None: a batch's plain step (no proposal)
        # whether this step's proposal read the recycling matrix: only such a step updates it
        # (a plain step's or a sure suffix draft's would pay a top-k over the vocabulary for
        # nothing: a fiftieth of a plain step of 8 SmolLM2 answers batched)
        self.recycled = False
        self.proposing = 0.0     # seconds of the last proposal
        self.step: bool | None = None      # an unsure step's arm
        self.verified = [0] * len(SOURCES)
        self.accepted = [0] * len(SOURCES)

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.suffix.prefill(prompt_ids, cache)
        if self.draft_model is not None:
            self.draft_model.prefill(prompt_ids, cache)

    def observe_prefill(self, tokens, out) -> None:
        if self.eagle is not None:
            self.eagle.observe_prefill(tokens, out)

    def propose(self, committed: list[int], budget: Budget) -> DraftTree:
        """The trie of this step (timed: a step's seconds are its proposal's and its part of
        the rest, TargetOutput.seconds, in a batch as alone)."""
        started = time.perf_counter()
        tree = self._propose(committed, budget)
        self.proposing = time.perf_counter() - started
        return tree

    def propose_if_sure(self, committed: list[int], budget: Budget) -> DraftTree | None:
        """The suffix matches' trie where they are sure of the next token (SURE_SUFFIX), as
        in a step this drafter's own gate takes plain, without the other sources' guesses
        (rows the batch's plain step is meant to save); their lookup only where the text's end
        occurred before (SuffixDrafter.repeats: a few us a step)."""
        if not self.suffix.repeats(committed):
            return None
        started = time.perf_counter()
        trie, sure = self._suffix_trie(committed, budget)
        if sure < SURE_SUFFIX:
            return None
        self.drafting, self.step, self.recycled = True, None, False
        tree = trie.build(self.device)
        self.proposing = time.perf_counter() - started
        return tree

    def _suffix_trie(self, committed: list[int], budget: Budget) -> tuple[TrieBuilder, float]:
        """A trie holding the suffix matches' drafts, and their likeliest next token's
        calibrated chance."""
        trie = TrieBuilder(committed[-1], CANDIDATES * budget.max_nodes, budget.max_depth)
        self.suffix.add_drafts(trie, committed, budget)
        return trie, self.suffix_chance(trie)

    def _propose(self, committed: list[int], budget: Budget) -> DraftTree:
        trie, sure = self._suffix_trie(committed, budget)
        self.step = None
        self.drafting = self.gate is None or self.gate.choose() or sure >= SURE_SUFFIX
        self.recycled = self.drafting
        if not self.drafting:                        # the root alone: a plain step
            return TrieBuilder(committed[-1], 1, budget.max_depth).build(self.device)
        models = self.eagle is not None or self.draft_model is not None
        if models and sure < MODELS_BELOW:
            self.step = self.rates.choose()
        if self.step:
            if self.eagle is not None:
                self.eagle.add_drafts(trie, committed, EAGLE_BUDGET, Source.EAGLE)
            if self.draft_model is not None:
                self.draft_model.add_drafts(trie, committed, DRAFT_MODEL_BUDGET,
                                            Source.DRAFT_MODEL)
        tpl = self.recycling.template(RECYCLING_BUDGET)
        tokens = tpl.fill_by_token(committed[-1], self.recycling.matrix).tolist()
        weights = [tpl.scores[i] / tpl.scores[p] for i, p in enumerate(tpl.parents) if p >= 0]
        trie.add_tree([p - 1 for p in tpl.parents[1:]], tokens[1:], probs=weights,
                      source=Source.RECYCLING)
        return trie.build(self.device)

    def plain_step(self) -> None:
        self.drafting, self.step, self.proposing, self.recycled = None, None, 0.0, False

    def suffix_chance(self, trie: TrieBuilder) -> float:
        """The calibrated chance of the suffix matches' likeliest next token (0 without one)."""
        return max((self.trust.chance(trie.sources[i], trie.scores[i])
                    for i in range(1, len(trie.tokens)) if trie.depths[i] == 1), default=0.0)

    def observe(self, tree, target_out, verdict) -> None:
        seconds = self.proposing + target_out.seconds
        if self.gate is not None and self.drafting is not None and not target_out.timing:
            self.gate.record(self.drafting, len(verdict.tokens), seconds)
        if self.step is not None and not target_out.timing:
            self.rates.record(self.step, len(verdict.tokens), seconds)
        if self.recycled:
            self.recycling.observe(tree, target_out, verdict)
        if self.eagle is not None:
            self.eagle.observe(tree, target_out, verdict)
        if self.draft_model is not None:
            self.draft_model.observe(tree, target_out, verdict)
        if tree.sources is None:        # a batch's plain step, its forced tokens grafted
            return
        passed = set(verdict.accepted)
        for node in range(1, tree.n):
            source = tree.sources[node]
            self.verified[source] += 1
            self.accepted[source] += node in passed

    def finish(self, tokens: list[int]) -> None:
        self.suffix.finish(tokens)
        self.recycling.finish(tokens)
        if self.draft_model is not None:
            self.draft_model.finish(tokens)

    def stats(self) -> dict:
        return {"sources": {name: {"verified": self.verified[i], "accepted": self.accepted[i]}
                            for i, name in enumerate(SOURCES)}}


SPEC = MethodSpec(
    name=SPEC_NAME, summary="every source the model has (suffix matches, recycling, its trained "
    "EAGLE drafter, a draft model when given) in one scored trie, verified as far as it pays "
    "(the default)",
    budget=Budget(48, 24), needs_heads=True, draft_model="optional", stats=("sources",),
    takes_prediction=True,
    options={"gate": Option(GATES[0], choices=GATES),
             "drafter": Option(DRAFTERS[0], choices=DRAFTERS)},
    build=lambda s: AutoDrafter(s.model, s.sampler, s.sizer, s.heads, s.context, s.draft_model,
                                s.capacity, gate=s.options["gate"],
                                found=s.options["drafter"], prediction=s.prediction))
