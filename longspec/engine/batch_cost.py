"""What a batch's step costs over its rows, as a Sizer reads step costs, and every member's
tree sized by it (engine/batching.py's docstring)."""

from __future__ import annotations

import time

from ..state.shared import StepCostTable
from ..step.sizing import Plan
from ..step.tree import DraftTree
from .generation import Engine
from .isolation import guarded


class BatchCost:
    """Seconds of a batch's step over R rows, as a Sizer reads step costs: the batch's plain
    step (each of its G members' root alone) plus what one generation's step grows by from G
    rows to R (`extra`: a member's own StepCost, measured on its cache and shared through the
    model's table): the rows past G stack on G rows already there. The plain step is the
    fastest real one seen of a batch of G at this context (the model's table, keyed by the sum
    of the members' contexts), else one generation's step over G rows; nothing is timed for it
    (docs/design.md, "Sizing")."""

    def __init__(self, table: StepCostTable, members: int, context: int, widest: Engine):
        """`widest`: the member whose trees may be largest; its StepCost is `extra`."""
        self.table = table
        self.members = members
        self.context = context
        self.widest = widest
        self.extra = widest.sizer.cost
        self._plain: float | None = None

    def plain_step(self) -> float:
        """Seconds of the batch's plain step (see the class's docstring); alone, the
        generation's own (so its costs are its StepCost's)."""
        if self._plain is None:
            seen = (None if self.members == 1
                    else self.table.lookup(self.members, self.members, self.context))
            self._plain = self.extra(self.members) if seen is None else seen
        return self._plain

    def missing(self, rows: int) -> int | None:
        """The first size the cost of `rows` needs that cannot be measured now (`extra`'s;
        none where the batch times what it needs: Batch._size)."""
        return self.extra.missing(max(rows, self.members))

    def __call__(self, rows: int) -> float:
        more = self.extra(max(rows, self.members)) - self.extra(self.members)
        return self.plain_step() + more

    def ahead_worth(self) -> float:
        """A token's worth, in the batch's tokens, to a closed batch whose end it does not move:
        its member leaves a step earlier, and the step seconds a member adds (the batch's plain
        step over one generation's, per member past the first) are saved once, where a plain
        step's tokens take a G-th of its seconds each (8 SmolLM2 answers on 2 cores: 0.65)."""
        plain = self.plain_step()
        return min(1.0, max(0.0, (plain - self.extra(1)) * self.members
                            / ((self.members - 1) * plain)))

    @property
    def measured(self) -> int:
        """The largest row count whose cost is measured, not extrapolated."""
        return self.extra.measured

    @property
    def measuring_s(self) -> float:
        return self.extra.measuring_s

    def observe(self, rows: int, seconds: float) -> None:
        """A real step over `rows` took `seconds`: a generation alone's is one of its own step
        costs (StepCost.observe), a batch's plain step is the table's."""
        if self.members == 1:
            self.extra.observe(rows, seconds)
        elif rows == self.members:
            self.table.record(self.members, rows, self.context, seconds)


def size_trees(engines: list[Engine], drafts: list[tuple[DraftTree, float]], cost: BatchCost,
               left: list[int], failed: dict[int, Exception], closed: bool
               ) -> tuple[list[Plan | None], list[float]]:
    """Each member's plan, its tree cut for the batch in turn, and the seconds each one's
    sizing took (timing steps for it left out); `left`: the tokens each member has left to
    generate; `closed`: Batch.closed. None for a member whose sizing raised (`failed`).

    A size not measured at this context is timed by a timing step over a throwaway tree, which
    the members wait for; alone, by the step itself over its draft's best nodes, as many
    (sizing.Plan.timing), where the draft has that many."""
    widest = cost.widest
    waiting = [e for e in engines if e is not widest]

    def measure(rows: int) -> float:
        seconds = widest.measure_step(rows)
        for e in waiting:
            e.stats.sizing_s += seconds
        return seconds

    adaptive = any(e.budget.sizing == "adaptive" for e in engines)
    if adaptive:
        cost.extra.refresh(len(widest.tokens), None if len(engines) == 1 else measure)
    drafting = sum(seconds for _, seconds in drafts)
    worth = worths(left, drafts, cost, closed) if adaptive else [1.0] * len(engines)
    rows = [1] * len(engines)
    gains = list(worth)         # each member's expected tokens, at its worth
    plans, seconds = [], []
    for i, (e, (tree, _)) in enumerate(zip(engines, drafts)):
        begin, measuring = time.perf_counter(), cost.measuring_s
        others = (sum(gains) - gains[i], sum(rows) - rows[i])

        def plan(e=e, tree=tree, others=others, worth=worth[i]) -> Plan:
            chosen = e.size(tree, drafting, cost, others, worth)
            if chosen.unmeasured:       # alone, a draft too small to time the size it needs
                cost.extra.refresh(len(widest.tokens), measure)
                chosen = e.size(tree, drafting, cost, others, worth)
            if chosen.timing and e.steps is not None:
                e.steps.capture(chosen.tree.n)      # a capture is not a step's cost
            return chosen

        chosen = guarded(failed, e, plan)
        plans.append(chosen)
        if chosen is None:
            seconds.append(0.0)
            continue
        rows[i] = chosen.tree.n
        if chosen.tree.scores is not None:
            gains[i] = worth[i] * sum(e.sizer.calibration.scores(chosen.tree))
        seconds.append(time.perf_counter() - begin - (cost.measuring_s - measuring))
    return plans, seconds


def worths(left: list[int], drafts: list[tuple[DraftTree, float]], cost: BatchCost,
           closed: bool) -> list[float]:
    """What a token of each member is worth to the batch, given what each has left to
    generate: 1, except in a closed batch (Batch.closed) of several for a member ahead of the
    batch's end, whose tokens save only the step seconds its leaving early does
    (BatchCost.ahead_worth)."""
    if not closed or len(left) == 1 or all(tree.n == 1 for tree, _ in drafts):
        return [1.0] * len(left)
    end, ahead = max(left), cost.ahead_worth()
    return [1.0 if n == end else ahead for n in left]
