"""What a batch's step costs over its rows, as a Sizer reads step costs (batching.py sizes
every member's tree by it)."""

from __future__ import annotations

from .engine import Engine
from .shared import StepCostTable


class BatchCost:
    """Seconds of a batch's step over R rows, as a Sizer reads step costs: the batch's plain
    step (each of its G members' root alone) plus what one generation's step grows by from G
    rows to R (`extra`: a member's own StepCost, measured on its cache and shared through the
    model's table). The rows' products are what grows with R, wherever the rows come from; the
    rows past G stack on G rows already there: on 2 cores, 3 rows more cost 8 SmolLM2 members
    2.0 ms, as one generation's step grows from 8 rows to 11 (1.9 ms), not from 1 to 4 (1.0 ms).

    The plain step is the fastest real one seen of a batch of G at this context (the model's
    table, keyed by the sum of the members' contexts), else one generation's step over G rows.
    Nothing is timed for it: timing every size of every composition took a sixth of a batch of
    8 SmolLM2 answers, and timing the plain step of each composition as members came and went
    still took 2% of it."""

    def __init__(self, table: StepCostTable, members: int, context: int, widest: Engine):
        """`widest`: the member whose trees may be largest; its StepCost is `extra`."""
        self.table = table
        self.members = members
        self.context = context
        self.widest = widest
        self.extra = widest.sizer.cost
        self._plain: float | None = None

    def plain_step(self) -> float:
        """Seconds of the batch's plain step (see the class's docstring)."""
        if self._plain is None:
            seen = self.table.lookup(self.members, self.members, self.context)
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
        if rows == self.members:
            self.table.record(self.members, rows, self.context, seconds)
