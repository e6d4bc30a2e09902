"""Draft size from measured costs, not constants (the evidence behind each rule: docs/design.md,
"Sizing").

A scored draft tree says, per node, how likely its path is to be accepted. Verifying the n best
nodes (a prefix of the score order, which keeps parents before children) costs one target
step over n nodes and is expected to commit 1 + the sum of their calibrated scores tokens.
The sizer picks the n that maximises expected tokens per second, counting the drafting time;
n = 1 is a plain decoding step.

- `StepCost`: seconds of a target step over n nodes at the current context, measured at a few
  sizes, only when a choice needs one, and interpolated; measured again as the context grows.
  A generation alone measures a size by a real step over its draft's best nodes, as many
  (`Plan.timing`; a timing step over a throwaway tree only where the draft has fewer); each
  size is timed once, and real steps then lower it to the fastest seen.
- `Calibration`: what each source's estimates are worth, learned online per source and bin of
  the estimated chance that a node follows its parent (how often such a node was accepted when
  its parent was). Each bin is read optimistically, one standard error above its mean, so a bin
  whose first nodes failed is tested again; it starts from PRIOR_WEIGHT pseudo-observations at
  its estimate times the source's accepted-over-estimated ratio over all bins, which starts
  from RATIO_WEIGHT pseudo-observations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..device.memory import upload
from ..state.shared import StepCostTable
from .tree import DraftTree, TreeShape

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
REFRESH_GROWTH = 1.25        # measure again when the context grew by a quarter...
REFRESH_MIN_TOKENS = 1024    # ...and by at least this many tokens
BINS = 32                    # of an estimate e: floor(4 * -log2 e), so low chances stay apart
PRIOR_WEIGHT = 2.0           # pseudo-observations of a bin's prior
RATIO_WEIGHT = 4.0           # ... and of a source's ratio (accepted over estimated)
EXPLORE = 1.0                # standard errors of optimism in a bin's chance
BIN_ESTIMATE = [2 ** (-(b + 0.5) / 4) for b in range(BINS)]   # the middle of each bin


@dataclass(frozen=True)
class Plan:
    """What a step verifies, as the sizer chose it: `tree`; `timing`: its size is one the
    choice needed that is not measured at this context (the draft's best nodes, as many), and
    its step measures it; `unmeasured`: a size the choice needs that the draft is too small to
    measure (a timing step must, then the draft is sized again), 0 when none."""

    tree: DraftTree
    timing: bool = False
    unmeasured: int = 0


class StepCost:
    """Seconds of this generation's target steps over up to max_rows rows, at its context.
    Sizes measured are also looked up in, and recorded to, the model's shared table
    (state/shared.py), so that a generation does not measure what an earlier one did at the same
    context."""

    def __init__(self, max_rows: int, table: StepCostTable | None = None):
        self.sizes = [n for n in SIZES if n < max_rows] + [max_rows]
        self.seconds: list[float] = []     # of the first len(seconds) sizes
        self.context = 0
        self.measuring_s = 0.0             # seconds spent measuring, all told
        self.table = table
        self._measure: Callable[[int], float] | None = None
        self._asked: int | None = None     # the size `missing` asked a real step for

    def refresh(self, context: int, measure: Callable[[int], float] | None) -> None:
        """Forget the measurements when the context has moved far enough from the one
        measured at; sizes are measured again (`measure(n)`: seconds of a timing step over n
        rows) as they are needed, or, without `measure`, by the real steps `missing` asks
        for."""
        self._measure = measure
        moved = abs(context - self.context)
        if self.seconds and moved < max(self.context * (REFRESH_GROWTH - 1), REFRESH_MIN_TOKENS):
            return
        self.seconds, self.context = [], context

    @property
    def measured(self) -> int:
        """The largest size measured (0: none)."""
        return self.sizes[len(self.seconds) - 1] if self.seconds else 0

    def missing(self, n: int) -> int | None:
        """The sizes around n measured first (looked up in the shared table, or timed where
        a timing step may be); the first size that could not be, None when none: without a
        timing step (refresh without `measure`), the next real step over that many rows
        measures it (observe)."""
        while len(self.seconds) < len(self.sizes) and self.measured < n:
            size = self.sizes[len(self.seconds)]
            t = self._lookup(size)
            if t is None:
                if self._measure is None:
                    self._asked = size
                    return size
                t = self._measure(size)
                self.measuring_s += t
                self._record(size, t)
            self.seconds.append(max(t, self.seconds[-1]) if self.seconds else t)  # never cheaper
        return None

    def _lookup(self, rows: int) -> float | None:
        if self.table is None:
            return None
        return self.table.lookup(1, rows, self.context)

    def _record(self, rows: int, seconds: float) -> None:
        if self.table is not None:
            self.table.record(1, rows, self.context, seconds)

    def observe(self, n: int, seconds: float) -> None:
        """A real step over n nodes took `seconds`: when `missing` asked for a step over n
        rows, that is its measurement; when n is a measured size, its time becomes the
        fastest seen (smaller sizes never cost more)."""
        if n == self._asked and len(self.seconds) < len(self.sizes) \
                and n == self.sizes[len(self.seconds)]:
            self._asked = None
            self.seconds.append(max(seconds, self.seconds[-1]) if self.seconds else seconds)
            self._record(n, seconds)
            return
        i = self.sizes.index(n) if n in self.sizes else len(self.seconds)
        if i >= len(self.seconds) or seconds >= self.seconds[i]:
            return
        self.seconds[i] = seconds
        self._record(n, seconds)
        for j in range(i):
            self.seconds[j] = min(self.seconds[j], seconds)

    def __call__(self, n: int) -> float:
        """Interpolated seconds of a step over n nodes (measuring the sizes around n first;
        a size that cannot be measured now is a ValueError: ask `missing` first)."""
        if (size := self.missing(n)) is not None:
            raise ValueError(f"a step over {size} rows is not measured at this context")
        return self._interpolate(n)

    def known(self, n: int) -> float | None:
        """The seconds of a step over n nodes from the sizes measured so far, measuring
        nothing: interpolated, or past the largest measured extended along the last two (the
        first alone: n times it); None when nothing is measured."""
        if not self.seconds:
            return None
        if n <= self.measured:
            return self._interpolate(n)
        secs, sizes = self.seconds, self.sizes
        if len(secs) == 1:
            return secs[0] * n / sizes[0]
        slope = (secs[-1] - secs[-2]) / (sizes[len(secs) - 1] - sizes[len(secs) - 2])
        return secs[-1] + slope * (n - self.measured)

    def _interpolate(self, n: int) -> float:
        sizes, secs = self.sizes, self.seconds
        if n >= sizes[-1]:
            return secs[-1] * n / sizes[-1]
        for i in range(1, len(secs)):
            if n <= sizes[i]:
                w = (n - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
                return secs[i - 1] + w * (secs[i] - secs[i - 1])
        return secs[0]


class Calibration:
    def __init__(self):
        self._tested: dict[int, list[int]] = {}     # per source and bin: nodes put to the test
        self._accepted: dict[int, list[int]] = {}   # ... and accepted
        self._hits: dict[int, int] = {}             # per source: accepted, over all bins
        self._expected: dict[int, float] = {}       # ... and what their bins' estimates said

    def share(self, other: Calibration) -> None:
        """Learn and read from `other`'s tables from now on, as one calibration (a batch's
        members of one method and sampling setting, stepping on one thread): what this one
        learned so far is dropped for what `other` has."""
        self._tested, self._accepted = other._tested, other._accepted
        self._hits, self._expected = other._hits, other._expected

    def _tables(self, source: int) -> tuple[list[int], list[int]]:
        if source not in self._tested:
            self._tested[source], self._accepted[source] = [0] * BINS, [0] * BINS
            self._hits[source], self._expected[source] = 0, 0.0
        return self._tested[source], self._accepted[source]

    @staticmethod
    def _bin(estimate: float) -> int:
        if estimate <= 0:
            return BINS - 1
        return min(BINS - 1, max(0, int(-4 * math.log2(min(estimate, 1.0)))))

    def chance(self, source: int, estimate: float) -> float:
        """The observed chance that a node with this estimate follows its parent, read
        optimistically (EXPLORE standard errors above the mean, at most 1)."""
        tested, accepted = self._tables(source)
        b = self._bin(estimate)
        ratio = (self._hits[source] + RATIO_WEIGHT) / (self._expected[source] + RATIO_WEIGHT)
        prior = min(1.0, BIN_ESTIMATE[b] * ratio)
        n = tested[b] + PRIOR_WEIGHT
        mean = (accepted[b] + PRIOR_WEIGHT * prior) / n
        return min(1.0, mean + EXPLORE * math.sqrt(mean * (1 - mean) / n))

    def scores(self, tree: DraftTree) -> list[float]:
        """Calibrated path scores of the tree's nodes (the root's is 1)."""
        parents, raw, sources = tree.shape.parents, tree.scores, tree.sources
        out = [1.0] * tree.n
        for i in range(1, tree.n):
            p = parents[i]
            estimate = raw[i] / raw[p] if raw[p] > 0 else 0.0
            out[i] = out[p] * self.chance(sources[i], estimate)
        return out

    def record(self, tree: DraftTree, accepted: list[int]) -> None:
        """Learn from a verified tree: each node whose parent was accepted was put to the
        test, and passed when it was accepted too."""
        parents, raw, sources = tree.shape.parents, tree.scores, tree.sources
        passed = set(accepted)
        for i in range(1, tree.n):
            p = parents[i]
            if p in passed:
                source = sources[i]
                tested, accepted_in_bin = self._tables(source)
                b = self._bin(raw[i] / raw[p] if raw[p] > 0 else 0.0)
                tested[b] += 1
                accepted_in_bin[b] += i in passed
                self._hits[source] += i in passed
                self._expected[source] += BIN_ESTIMATE[b]


def score_order(scores: list[float]) -> list[int]:
    """A scored tree's nodes past the root, best first (ties: the earlier node), so that every
    prefix keeps its nodes' parents."""
    return sorted(range(1, len(scores)), key=lambda i: (-scores[i], i))


def prefix(tree: DraftTree, order: list[int], n: int) -> DraftTree:
    """The tree's root and the first n - 1 nodes of a score order (score_order)."""
    return subtree(tree, sorted([0, *order[:n - 1]]))


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The tree restricted to the nodes `keep` (increasing, the root first, parents kept)."""
    new = {old: k for k, old in enumerate(keep)}
    parents = tuple([-1] + [new[tree.shape.parents[i]] for i in keep[1:]])
    index = upload(keep, tree.tokens.device)
    probs = None if tree.draft_probs is None else tree.draft_probs[index[1:] - 1]
    return DraftTree(TreeShape.of(parents, tree.shape.device), tree.tokens[index], probs,
                     [tree.scores[i] for i in keep], [tree.sources[i] for i in keep])


def calibration_key(method: str, config) -> tuple:
    """The key of a method's calibration under a sampling setting in a model's shared state."""
    return ("calibration", method, config)


class Sizer:
    """Prunes scored trees to the size that pays most, and learns from the verdicts."""

    def __init__(self, cost: StepCost, calibration: Calibration):
        self.cost = cost
        self.calibration = calibration

    def choose(self, tree: DraftTree, draft_seconds: float, max_nodes: int,
               adaptive: bool = True, *, cost: StepCost | None = None,
               others: tuple[float, int] = (0.0, 0), worth: float = 1.0) -> Plan:
        """The prefix of the tree's score order, of at most `max_nodes` nodes, that maximises
        expected new tokens per second (adaptive), or that has `max_nodes` nodes by the
        drafter's own scores (fixed); where the choice needs a size not measured, the plan to
        measure it (Plan). In a batch, the rate is the batch's: `others` are the expected new
        tokens (each counted at its worth) and the rows of the other generations sharing the
        step, `cost` the batch's step costs (default: this generation's), `worth` what each of
        this generation's tokens counts for."""
        if tree.scores is None or tree.n == 1:
            return Plan(tree)
        if not adaptive:
            if tree.n <= max_nodes:
                return Plan(tree)
            return Plan(prefix(tree, score_order(tree.scores), max_nodes))
        cost = self.cost if cost is None else cost
        gained, rows = others
        scores = self.calibration.scores(tree)
        order = score_order(scores)[:max_nodes - 1]
        if (size := cost.missing(rows + 1)) is not None:
            return self._measuring(tree, order, size)
        best, gain = 1, 1.0
        best_rate = (gained + worth * gain) / (draft_seconds + cost(rows + 1))
        rest = sum(scores[node] for node in order)      # the gain of the nodes not yet taken
        for k, node in enumerate(order, start=2):
            if rows + k > cost.measured:
                # no larger prefix costs less than the largest size measured, nor gains more
                # than all the rest: when even that cannot pay, stop before measuring more
                bound = (gained + worth * (gain + rest)) / (draft_seconds + cost(cost.measured))
                if bound <= best_rate:
                    break
            if (size := cost.missing(rows + k)) is not None:
                return self._measuring(tree, order, size)
            gain += scores[node]
            rest -= scores[node]
            rate = (gained + worth * gain) / (draft_seconds + cost(rows + k))
            if rate > best_rate:
                best, best_rate = k, rate
        if best == tree.n:
            return Plan(tree)
        return Plan(prefix(tree, order, best))

    @staticmethod
    def _measuring(tree: DraftTree, order: list[int], size: int) -> Plan:
        """The plan that measures a step over `size` rows: the draft's best nodes (`order`),
        as many, where it has that many."""
        if size <= tree.n:
            return Plan(prefix(tree, order, size), timing=True)
        return Plan(tree, unmeasured=size)

    def record(self, tree: DraftTree, accepted: list[int]) -> None:
        if tree.scores is not None:
            self.calibration.record(tree, accepted)


def generation_sizer(model, method: str, config, max_nodes: int) -> Sizer:
    """A new generation's sizer: step costs of its own (looking up the model's shared table
    before measuring) and the calibration that the last generation of the method under this
    sampling setting ended with."""
    return Sizer(StepCost(max_nodes, model.state.step_costs),
                 model.state.checkout(calibration_key(method, config), Calibration))
