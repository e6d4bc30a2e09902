"""Batched verification: several generations stepping together on one model, in one step
function for one generation and many (docs/design.md, "The step" and "Sizing").

Each step, every member drafts its tree; the trees are sized for the batch (engine/batch_cost.py);
one forward verifies them all (`Transformer.forward_many`: every row bitwise what it is in its
generation's own forward, so each member writes what it writes alone); then each member judges
and commits its own verdict. A generation joins at a step boundary (its prefill runs then, or a
chunk of it before each step: admit) and leaves when it is done or dropped. A generation alone
is a batch of one (api.Stream): the same step, its forward its own (CUDA graphs included),
whether to draft its drafter's choice (auto's gate), and a size its sizing needs timed by a
real step of its draft's best nodes (sizing.Plan). In a batch, whether to draft is measured
twice: the batch's drafting steps against its plain steps (Batch.gate), and each drafter's own
gate. In the batch's plain steps a member whose drafter is sure of its tree still drafts
(Drafter.propose_if_sure), so a generation that copies or repeats itself is not held to plain
steps by the others. Members of one method and sampling setting learn one calibration
(Calibration.share).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import TYPE_CHECKING

import torch

from ..device.memory import PeakMemory
from ..drafters.auto import StepRates
from ..models.graphs import BatchSteps, graphs_wanted
from ..sampling.sampler import choices_together, samples_together
from ..step.sizing import calibration_key
from ..step.tree import DraftTree
from ..step.verify import TargetOutput, Verdict, verify_trees
from .batch_cost import BatchCost, size_trees
from .generation import Engine
from .isolation import alive, guarded

if TYPE_CHECKING:       # the streams a batch steps (api.py steps one alone in a batch of one)
    from ..api import Chunk, Stream

log = logging.getLogger("longspec.engine.batching")

# generations a batch steps at once, unless told: on 2 CPU cores plain decoding gains 1.15x
# more from 4 to 8 SmolLM2 chat answers and `auto` 1.10x, while each generation's memory is
# paid that many times (docs/benchmarks/batching.md)
DEFAULT_MAX_BATCH = 4
# the share of a batch's seconds its gate's drafting tries may lose against its plain steps
# (StepRates' budget; docs/design.md, "Sizing")
TRY_BUDGET = 0.01
# the most prompt tokens a joining stream's prefill runs between two of the batch's steps
# (admit): the members wait at most one such chunk (on a CPU, prefill.MAX_CHUNK's own size)
ADMISSION_CHUNK = 256


class Batch:
    """The streams (api.Stream) of the generations stepping together on one model."""

    def __init__(self, model):
        self.model = model
        self.members: list[Stream] = []
        # drafting at all (True) or a plain step for every member whose drafter allows one
        # and is not sure of a tree (False), as measured in what the batch's steps are worth
        # (_worth) a second (auto.py's gate, for a batch); plain steps first, the drafting
        # tries spaced by what they lose
        self.gate = StepRates(retried=(True,), budget=TRY_BUDGET)
        # in its plain steps, the members' sure drafts (propose_if_sure) allowed (True) or
        # not, as measured: the steps that carried some against the plain ones
        self.sure = StepRates(retried=(True,))
        # no generation waits to join (run_streams sets it): the batch is done when its last
        # member is, so a step counts for how far it moves that end (_worth), not for every
        # member's tokens
        self.closed = False
        # the members' tree steps at static shapes, captured together (models/graphs.py)
        self.steps = (BatchSteps(model.net, model.state.captures) if graphs_wanted(model.net)
                      else None)
        self.together = samples_together(model.device)
        self._memory: PeakMemory | None = None     # while it has members or joining streams
        # the streams admitted whose prefill runs a chunk a step, each with its start
        # (Engine.starting), in arrival order
        self.joining: list[tuple[Stream, Generator[None, None, None]]] = []

    def __len__(self) -> int:
        return len(self.members) + len(self.joining)

    def join(self, stream: Stream) -> list[Chunk]:
        """Start the stream's generation (its whole prefill, now) and step it with the others
        from the next step; a generation with nothing left to do ends at once. The chunk of
        a first step its prefill took (Engine.first), if any."""
        self.admit(stream, None)
        chunks = []
        while any(s is stream for s, _ in self.joining):
            for _, item in self._prefill_chunk(whole=True):
                if isinstance(item, Exception):
                    raise item
                chunks.append(item)
        return chunks

    def admit(self, stream: Stream, max_chunk: int | None = ADMISSION_CHUNK) -> None:
        """Let the stream join: its prefill runs a chunk (`max_chunk` tokens; None: a plain
        prefill's) a step (step), ahead of the members' forward, so that they wait at most one
        chunk for it; a generation with nothing left to do ends at once."""
        if stream.engine.done:
            stream.end(True)
            return
        if self._memory is None:
            self._memory = PeakMemory(self.model.device).__enter__()
        self.joining.append((stream, stream.engine.starting(stream.start_ids, max_chunk)))

    def _become_member(self, stream: Stream) -> None:
        self._share_calibration(stream.engine)
        self.members.append(stream)

    def _prefill_chunk(self, whole: bool = False) -> list[tuple[Stream, Chunk | Exception]]:
        """One chunk of the first joining stream's prefill (all of it while no member waits,
        or when `whole`); a stream whose prefill ends becomes a member. The chunk of a stream
        whose prefill took its first step (Engine.first), or the exception of one whose
        prefill failed (it left)."""
        stream, starting = self.joining[0]
        try:
            while True:
                next(starting)
                if self.members and not whole:
                    return []
        except StopIteration:
            self.joining.pop(0)
            self._become_member(stream)
        except Exception as e:      # noqa: BLE001 (its generation ends with it, alone)
            self.joining.pop(0)
            stream.end(False)
            self._close_memory_if_idle()
            return [(stream, e)]
        engine = stream.engine
        if engine.first is None:
            return []
        first, engine.first = engine.first, None
        return [self._handed_out(stream, first)]

    def _share_calibration(self, engine: Engine) -> None:
        """A member of the method and sampling setting of one already here learns and reads
        that one's calibration: what one member's drafts show, the others read at the next
        step, where each would first see its own drafts fail."""
        key = calibration_key(engine.method, engine.sampler.config)
        for s in self.members:
            if calibration_key(s.engine.method, s.engine.sampler.config) == key:
                engine.sizer.calibration.share(s.engine.sizer.calibration)
                return

    def leave(self, stream: Stream, finished: bool) -> None:
        """Drop a member: its generation ends (`finished`) or is stopped where it is (a stream
        still joining, in its prefill: stopped). A stream that is neither (it left already) is
        left alone. The stream ends and leaves even where its engine's finish raises; the error
        then goes on to the caller."""
        joining = [entry for entry in self.joining if entry[0] is stream]
        if joining:
            self.joining.remove(joining[0])
            joining[0][1].close()
            stream.end(False)
            self._close_memory_if_idle()
            return
        if stream not in self.members:
            return
        self.members.remove(stream)
        engine = stream.engine
        try:
            if self.steps is not None and engine.steps is not None:
                self.steps.forget(engine.steps)
            engine.finish()
        finally:
            engine.stats.peak_memory_bytes = self._memory.so_far()
            stream.end(finished)
            self._close_memory_if_idle()

    def _close_memory_if_idle(self) -> None:
        if not self.members and not self.joining and self._memory is not None:
            self._memory.__exit__(None)
            self._memory = None

    def close(self) -> None:
        """Stop every member where it is, and every stream still joining (each one's finish
        raising or not)."""
        for s in [stream for stream, _ in self.joining] + list(self.members):
            try:
                self.leave(s, False)
            except Exception:   # stopping: what it learned is lost, nothing else
                log.exception("a generation's finish failed while its batch closed")

    def step(self) -> list[tuple[Stream, Chunk | Exception]]:
        """A chunk of a joining stream's prefill (admit), then one step of every member (but
        one whose first step that prefill took): each stream's chunk of new tokens, or the
        exception that ended its generation. A fault in a member's own part of the step (its
        prefill, drafting, sizing, judging, committing, text or finish) ends that generation
        alone; one in the forward they share ends them all. Members that are done or failed
        leave."""
        joined = self._prefill_chunk() if self.joining else []
        begin = time.perf_counter()
        # a member whose first step its prefill just took (its chunk in `joined`) steps from
        # the next step on: that token goes out with this step's, not after its next one
        members = [s for s in self.members if all(s is not j for j, _ in joined)]
        if not members:
            return joined
        failed: dict[int, Exception] = {}       # by id(engine)
        try:
            news = self._step([s.engine for s in members], failed)
        except Exception as e:      # noqa: BLE001 (the step they share: handed to each member)
            news, failed = {}, {id(s.engine): e for s in members}
        seconds = time.perf_counter() - begin
        out: list[tuple[Stream, Chunk | Exception]] = list(joined)
        for stream in members:
            engine = stream.engine
            if id(engine) in failed:
                out.append(self._failed(stream, failed[id(engine)]))
                continue
            engine.stats.decode_s += seconds
            out.append(self._handed_out(stream, news[id(engine)]))
        return out

    def _handed_out(self, stream: Stream, new: list[int]) -> tuple[Stream, Chunk | Exception]:
        """The chunk of what a member's step committed (it leaves when done), or the exception
        that ended it there."""
        try:
            chunk = stream.take(new)
            if stream.engine.done:
                self.leave(stream, True)
            return stream, chunk
        except Exception as e:  # noqa: BLE001 (handed to the caller with its stream)
            return self._failed(stream, e)

    def _failed(self, stream: Stream, error: Exception) -> tuple[Stream, Exception]:
        """A member whose generation failed, gone."""
        try:
            self.leave(stream, False)
        except Exception:   # the generation failed already: this adds nothing
            log.exception("a failed generation's finish failed too")
        return stream, error

    def _step(self, engines: list[Engine], failed: dict[int, Exception]
              ) -> dict[int, list[int]]:
        """The tokens each member's step commits, by id(engine); a member whose own part
        raises is in `failed` instead and out of the rest of the step."""
        alone = len(engines) == 1       # drafting is its drafter's choice (auto's gate)
        # the member whose trees may be largest measures what rows add
        cost = BatchCost(self.model.state.step_costs, len(engines), sum(len(e.tokens) for e in
                         engines), max(engines, key=lambda e: e.budget.max_nodes))
        started, measured = time.perf_counter(), cost.measuring_s
        drafting = alone or self.gate.choose()
        sure = not drafting and self.sure.choose()
        drafts = [guarded(failed, e, lambda e=e: self._proposal(e, drafting, sure))
                  for e in engines]
        engines, drafts = alive(failed, engines, drafts)
        left = [e.max_new_tokens - e.stats.new_tokens for e in engines]
        plans, sizing = size_trees(engines, drafts, cost, left, failed, self.closed)
        engines, plans, sizing, left = alive(failed, engines, plans, sizing, left)
        if not engines:
            return {}
        trees = [plan.tree for plan in plans]
        begin = time.perf_counter()
        outs = self._forward(engines, trees)
        forward_s = time.perf_counter() - begin
        rows = sum(t.n for t in trees)
        # each member's part of the step: its sizing, its rows' share of the forward
        verdicts = self._judge(engines, trees, outs, [seconds + forward_s * tree.n / rows
                                                      for tree, seconds in zip(trees, sizing)],
                               failed)
        cost.observe(rows, time.perf_counter() - begin)
        news = []
        for e, plan, judged in zip(engines, plans, verdicts):
            e.stats.verify_forward_s += forward_s
            if judged is not None:
                judged[0].timing = plan.timing
                e.stats.timing_steps += plan.timing
            news.append(None if judged is None else guarded(
                failed, e, lambda e=e, t=plan.tree, j=judged: e.commit(t, *j)))
        engines, trees, left, news = alive(failed, engines, trees, left, news)
        if not alone:
            measuring = cost.measuring_s - measured      # timing steps: not a step's
            worth, seconds = self._worth(left, news), time.perf_counter() - started - measuring
            self.gate.record(drafting, worth, seconds)
            carried = any(t.n > 1 for e, t in zip(engines, trees) if e.drafter.plain_steps)
            if not drafting and (carried or not sure):  # sure drafts carried, or none allowed
                self.sure.record(sure, worth, seconds)
        return {id(e): new for e, new in zip(engines, news)}

    def _forward(self, engines: list[Engine], trees: list[DraftTree]) -> list:
        """The target's one forward over every member's tree: a member alone's own forward;
        at static shapes where the members' steps run so (captured on CUDA), else eagerly."""
        if len(engines) == 1:
            return [engines[0].forward(trees[0], engines[0].drafter.needs_hidden)]
        if self.steps is not None and all(e.steps is not None for e in engines):
            outs = self.steps([e.steps for e in engines], trees,
                              [e.max_new_tokens - e.stats.new_tokens for e in engines])
            if outs is not None:
                return outs
        hidden = any(e.drafter.needs_hidden for e in engines)
        return self.model.net.forward_many([e.segment(t) for e, t in zip(engines, trees)],
                                           return_hidden=hidden)

    def _judge(self, engines: list[Engine], trees: list[DraftTree], outs: list,
               seconds: list[float], failed: dict[int, Exception]
               ) -> list[tuple[TargetOutput, Verdict] | None]:
        """Each member's TargetOutput and verdict, as Engine.judge gives them (`seconds`: each
        one's part of the step so far): together where the batch samples together
        (samples_together) and its members (two or more) share a sampling setting outside
        rejection mode, else one member at a time (None for a member whose judging raised:
        `failed`)."""
        samplers = [e.sampler for e in engines]
        config = samplers[0].config
        if len(engines) == 1 or not self.together or any(s.config != config or s.rejection
                                                         for s in samplers):
            return [guarded(failed, e, lambda e=e, t=tree, o=out, p=part: e.judge(t, o, p))
                    for e, tree, out, part in zip(engines, trees, outs, seconds)]
        begin = time.perf_counter()
        processed, choices = choices_together(samplers, trees,
                                              torch.cat([out.logits for out in outs]))
        sizes = [tree.n for tree in trees]
        targets = [TargetOutput(out, p, c) for out, p, c in
                   zip(outs, processed.split(sizes), choices.split(sizes))]
        verdicts = verify_trees(trees, [target.target_tokens for target in targets])
        judging = (time.perf_counter() - begin) / sum(sizes)     # split by rows
        for target, part, n in zip(targets, seconds, sizes):
            target.seconds = part + judging * n
        return list(zip(targets, verdicts))

    def _worth(self, left: list[int], news: list[list[int]]) -> int:
        """A step's worth in new tokens, given what each member had left to generate: all of
        them; in a closed batch, how far the step moved the batch's end (its longest way left)
        times the members, which is what a plain step's tokens are (a member's end at a stop
        rule not counted: its way left stays where it was). There, tokens drafted ahead
        of the others pay only as the step costs that their member's leaving early saves,
        which the gate's seconds see."""
        if not self.closed:
            return sum(len(new) for new in news)
        end = max(n - len(new) for n, new in zip(left, news))
        return (max(left) - end) * len(news)

    def _proposal(self, e: Engine, drafting: bool, sure: bool) -> tuple[DraftTree, float]:
        """The member's tree for this step and the seconds it took: its drafter's, or, in a
        step the batch takes plain and on a generation's first step when its first token is
        asked early (Engine.early_first_token), its root alone, where its drafter can skip a
        step (`plain_steps`)."""
        if not e.drafter.plain_steps:
            return e.draft()
        if e.early_first_token and e.stats.new_tokens == 0:
            return self._plain_step(e, False)
        return e.draft() if drafting else self._plain_step(e, sure)

    @staticmethod
    def _plain_step(e: Engine, sure: bool) -> tuple[DraftTree, float]:
        """The member's root alone, unless sure drafts are allowed (`sure`) and its drafter is
        sure of a tree (propose_if_sure), and the seconds that took."""
        begin = time.perf_counter()
        tree = e.drafter.propose_if_sure(e.tokens, e.budget) if sure else None
        if tree is not None:
            return tree, time.perf_counter() - begin
        e.drafter.plain_step()
        return DraftTree.chain(e.tokens[-1:], e.device), 0.0
