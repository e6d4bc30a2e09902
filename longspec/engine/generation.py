"""One generation's state and its part of a step: its cache, sampler, drafter and stop rules.

A step (engine/batching.py: one function for a generation alone and for many) runs each member's
parts in turn:

    tree = engine.draft()                       # the drafter's tree, rooted at the last token
    plan = engine.size(tree, ...)               # its best prefix for the step (step/sizing.py)
    out = engine.forward(plan.tree)             # or one forward of every member's tree
    target, verdict = engine.judge(tree, out)   # the target's choices; the one host transfer
    new = engine.commit(tree, target, verdict)  # the only place that changes state

A first step that would verify the prompt's last token alone takes its output from the
prefill's last row instead, with no forward of its own (`starting`).

The engine owns the KV cache, the sampling state and the stop rules; it prints nothing.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import replace

import torch

from ..cache import StaticCache
from ..device.memory import upload
from ..drafters.base import Budget, Drafter
from ..models.graphs import StaticSteps, graphs_wanted
from ..models.loader import Model
from ..models.prefill import prefilling
from ..models.transformer import Segment
from ..outputs.grammar import graft
from ..outputs.stopping import StopRules
from ..sampling.logits import token_logprobs
from ..sampling.sampler import Sampler
from ..step.forward import ForwardOutput
from ..step.sizing import Plan, Sizer, StepCost, calibration_key, subtree
from ..step.stats import Stats
from ..step.tree import DraftTree, TreeTemplate
from ..step.verify import TargetOutput, Verdict, verify

MEASURE_DEPTH = 8       # depth of the trees step costs are measured on


class Engine:
    """One generation: a prompt in, committed tokens out (a batch steps it: engine/batching.py)."""

    def __init__(self, model: Model, drafter: Drafter, sampler: Sampler,
                 budget: Budget, max_new_tokens: int, stop: StopRules, method: str, *,
                 sizer: Sizer):
        """`sizer`: the generation's own (its step costs and calibration, which its drafter
        reads too: `generation_sizer`)."""
        self.model = model
        self.net = model.net
        self.drafter = drafter
        self.sampler = sampler
        self.budget = budget
        self.max_new_tokens = max_new_tokens
        self.stop = stop
        self.device = model.device
        profile = model.profile
        self.stats = Stats(method, str(model.device), str(model.dtype).removeprefix("torch."),
                           model.weight_format, None if profile is None else profile.as_dict(),
                           "on" if profile is None else profile.speculation)
        self.tokens: list[int] = []      # committed: prompt, then new tokens
        self.cache: StaticCache | None = None
        self.steps: StaticSteps | None = None    # tree steps at static shapes (graphs.py)
        self.done = False
        self.started = 0.0      # perf_counter() when start() began, less the time others ran
                                # between its prefill chunks
        self.method = method
        self.sizer = sizer
        self.forced = 0                          # forced tokens leading this step's tree
        # each committed token's logprobs (sampling.token_logprobs) with this many
        # alternatives, when asked for (None: not)
        self.logprobs_top: int | None = None
        self.logprobs: list[dict] = []
        # the first step plain where the drafter can skip one (Request.early_first_token)
        self.early_first_token = False
        # what a first step taken from the prefill's last row committed, not yet handed out
        # (starting: _first_step_in_prefill)
        self.first: list[int] | None = None

    # -- set-up ---------------------------------------------------------------------------------

    def plan_capacity(self, prompt_len: int) -> int:
        """Cache slots: the whole sequence plus room for one draft tree (padded to its bucket
        of rows where tree steps run at static shapes)."""
        rows = self.budget.max_nodes
        if graphs_wanted(self.net):
            rows = StaticSteps.rows_needed(rows)
        return prompt_len + self.max_new_tokens + rows + 1

    def check_memory(self, prompt_len: int) -> None:
        """Raise ValueError, before anything is allocated, when the KV cache would not fit (the
        slots a kept one it takes has touched are there; where none holds it, all are let go
        first)."""
        capacity = self.plan_capacity(prompt_len)
        self.model.state.kept_caches.ensure_fits(
            capacity, self.model.config.kv_bytes_per_token(self.model.dtype.itemsize),
            self.device, f"the KV cache for {prompt_len} prompt + {self.max_new_tokens} new "
            "tokens", "lower max_new_tokens or the prompt length, or use dtype bfloat16")

    def starting(self, prompt_ids: list[int], max_chunk: int | None = None
                 ) -> Generator[None, None, None]:
        """Prefill the prompt a chunk (at most `max_chunk` tokens; None: the device's
        prefill.MAX_CHUNK) at a time, yielding between chunks (a batch steps its running
        generations there, engine/batching.py). stats.prefill_s counts its own time only."""
        begin = time.perf_counter()
        spent = 0.0                 # the time of the chunks before the current one's
        capacity = self.plan_capacity(len(prompt_ids))
        state = self.model.state
        kept = state.kept_caches.take(capacity)
        self.cache, self.steps = kept or (
            StaticCache(self.model.config, capacity, self.model.dtype, self.device), None)
        if self.steps is None and graphs_wanted(self.net):
            self.steps = StaticSteps(self.net, self.cache, state.captures)
        d = self.drafter
        wants_output = d.needs_prefill_logits or d.needs_hidden
        # the longest prefix an earlier sequence on this model shares is copied, not computed
        # (state/prompt_cache.py: the same bits); the drafters observe the rest
        prompt_cache = state.prompt_cache
        cached = prompt_cache.restore(prompt_ids[:-1], self.cache)
        folded = self._first_step_in_prefill()
        chunks = prefilling(self.net, prompt_ids[cached:len(prompt_ids) - 1 + folded],
                            self.cache, cached, last_logits=int(folded),
                            need_logits=d.needs_prefill_logits, return_hidden=d.needs_hidden,
                            on_chunk=d.observe_prefill if wants_output else None,
                            max_chunk=max_chunk)
        while True:
            try:
                next(chunks)
            except StopIteration as end:
                logits = end.value      # the last row's, where folded
                break
            self._sync()
            spent += time.perf_counter() - begin
            yield
            begin = time.perf_counter()
        if folded:      # the last token's keys stay in its slot, as a step's stay till commit
            self.cache.rollback(self.cache.length - 1)
        prompt_cache.store(prompt_ids, self.cache)
        self.tokens = list(prompt_ids)
        self.sampler.commit(prompt_ids)
        d.prefill(list(prompt_ids), self.cache)
        self._sync()
        self.stats.prefill_s = spent + time.perf_counter() - begin
        self.started = time.perf_counter() - self.stats.prefill_s
        self.stats.cached_tokens = cached
        if folded:
            d.plain_step()
            tree = DraftTree.chain(self.tokens[-1:], self.device)
            self.first = self.commit(tree, *self.judge(tree, ForwardOutput(logits, None), 0.0))

    def _first_step_in_prefill(self) -> bool:
        """Whether the first step is taken from the prefill's last row: where it would verify
        the prompt's last token alone (plain decoding; a plain first step, early_first_token)
        and needs nothing of a forward but that row's logits (no hidden states, no forced
        tokens). The prefill then takes that token too, and the step no forward of its own:
        its token comes one pass over the weights sooner (llama.cpp samples the first token
        from the prompt's batch too). The same bits: a row is what it is in a prompt's chunk
        or alone (the row check)."""
        d = self.drafter
        plain = d.plain_steps and (self.budget.max_nodes == 1 or self.early_first_token)
        return (plain and not d.needs_hidden and not d.needs_prefill_logits
                and self.sampler.grammar is None)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- one step: propose -> verify -> commit ----------------------------------------------------

    def forward(self, tree: DraftTree, hidden: bool = False):
        """The target's forward over the tree (its keys into the slots past the committed)."""
        if self.steps is not None:
            return self.steps(tree, self.max_new_tokens - self.stats.new_tokens)
        s = self.segment(tree)
        return self.net(s.tokens, s.positions, s.cache, s.mask, return_hidden=hidden)

    def judge(self, tree: DraftTree, out: ForwardOutput, seconds: float
              ) -> tuple[TargetOutput, Verdict]:
        """The target's choice after every node of the tree, from its forward's output, and
        the verdict (the one host transfer of a step); `seconds`: this generation's part of
        the step so far, outside its drafter's proposal (TargetOutput.seconds)."""
        begin = time.perf_counter()
        processed, choices = self.sampler.tree_choices(tree, out.logits)
        target = TargetOutput(out, processed, choices)
        verdict = verify(tree, target, self.sampler)
        target.seconds = seconds + time.perf_counter() - begin
        return target, verdict

    def measure_step(self, n: int) -> float:
        """Seconds of a target step over a throwaway tree of n nodes shaped like the drafts
        (a best-first template; trees cost more than chains in attention). Its keys land in
        uncommitted slots; nothing else changes."""
        shape = TreeTemplate(n, min(n - 1, MEASURE_DEPTH), self.device).shape
        tree = DraftTree(shape, upload(self.tokens[-1:] * n, self.device))
        if self.steps is not None:
            self.steps.capture(n)
        self._sync()
        begin = time.perf_counter()
        out = self.forward(tree)
        self.sampler.tree_choices(tree, out.logits)[1].tolist()
        seconds = time.perf_counter() - begin
        self.stats.sizing_s += seconds
        return seconds

    def draft(self) -> tuple[DraftTree, float]:
        """The drafter's tree and the seconds it took; a scored tree (one the sizer cuts) less
        the nodes whose paths the generation's grammar forbids, which no verdict accepts."""
        begin = time.perf_counter()
        tree = self.drafter.propose(self.tokens, self.budget)
        grammar = self.sampler.grammar
        if grammar is not None and tree.scores is not None and tree.n > 1:
            allowed = grammar.allowed_nodes(tree)
            if len(allowed) < tree.n:
                tree = subtree(tree, allowed)
        return tree, time.perf_counter() - begin

    def size(self, tree: DraftTree, draft_seconds: float, cost: StepCost,
             others: tuple[float, int], worth: float) -> Plan:
        """The tree cut to the size that pays most (step/sizing.py), when it is scored, by the
        step's costs, the other members' expected new tokens and rows (`others`), and what its
        tokens are worth to the batch (`worth`); then the tokens a grammar forces lead it."""
        plan = Plan(tree)
        if tree.scores is not None and tree.n > 1:
            plan = self.sizer.choose(tree, draft_seconds, self.budget.max_nodes,
                                     self.budget.sizing == "adaptive", cost=cost, others=others,
                                     worth=worth)
        return replace(plan, tree=self.with_forced(plan.tree))

    def with_forced(self, tree: DraftTree) -> DraftTree:
        """The tree with the tokens the generation's grammar forces next as a chain below its
        root (grammar.graft), for a method that drafts: drafts that cannot be wrong, verified
        as drafts."""
        grammar = self.sampler.grammar
        self.forced = 0
        if grammar is None or self.budget.max_nodes < 2:
            return tree
        forced = grammar.forced()
        if not forced:
            return tree
        self.forced = min(len(forced), self.budget.max_nodes - 1)
        return graft(tree, forced, self.budget.max_nodes)

    def segment(self, tree: DraftTree) -> Segment:
        """The tree as its part of a forward of several generations (engine/batching.py)."""
        return Segment(tree.tokens, tree.shape.depth + self.cache.length, self.cache,
                       tree.shape.mask(self.model.dtype))

    def commit(self, tree: DraftTree, target: TargetOutput, verdict: Verdict) -> list[int]:
        """Commit the verdict's tokens, cut at a stop rule or at max_new_tokens: keep their keys
        and values, extend the sequence, advance the sampler, let the drafter learn."""
        room = self.max_new_tokens - self.stats.new_tokens
        stop_at = self.stop.cut(verdict.tokens)
        n = min(stop_at or len(verdict.tokens), room)
        self.done = stop_at is not None or len(verdict.tokens) >= room
        accepted_drafts = min(verdict.accept_length, n)     # the bonus may be cut, drafts too
        if n < len(verdict.tokens):
            verdict = Verdict(verdict.accepted[:n], verdict.tokens[:n])
        self.cache.keep(verdict.accepted)
        self.sizer.record(tree, verdict.accepted)
        new = verdict.tokens
        if self.logprobs_top is not None:
            self.logprobs += token_logprobs(target.processed, verdict.accepted, new,
                                            self.logprobs_top)
        self.tokens.extend(new)
        self.sampler.commit(new)
        self.drafter.observe(tree, target, verdict)
        s = self.stats
        if s.new_tokens == 0:
            s.first_token_s = time.perf_counter() - self.started
        s.steps += 1
        s.verified_nodes += tree.n
        s.drafted_tokens += tree.shape.max_depth
        s.accepted_draft_tokens += accepted_drafts
        s.forced_tokens += self.forced
        s.accepted_forced_tokens += min(self.forced, accepted_drafts)
        self.forced = 0
        s.new_tokens += len(new)
        return new

    def finish(self) -> None:
        """The generation ended (or stopped): what its drafters and its sizer learned goes
        to the model's shared state, for the generations after it (the step costs to their
        file too, for later processes), and so do its cache and its captured steps."""
        self.drafter.finish(self.tokens)
        state = self.model.state
        state.publish(calibration_key(self.method, self.sampler.config), self.sizer.calibration)
        state.step_costs.save()
        state.prompt_cache.store(self.tokens, self.cache)
        state.kept_caches.give(self.cache, self.steps)

    def result_stats(self) -> dict:
        return {**self.stats.as_dict(), **self.drafter.stats()}
