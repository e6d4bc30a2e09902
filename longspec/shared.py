"""What the generations on one model share, and nothing else.

A generation owns its KV cache, its drafters' tables and the step costs measured at its own
context. What it shares with the other generations on its model lives here, typed, behind one
lock, so generations on several threads (or interleaved on one) may use it at once:

- `suffix_outputs`: the suffix index of earlier outputs (suffix_index.py), which every finished
  generation adds its output to and every generation drafts from;
- `step_costs`: seconds of a target step, keyed by the generations in the step, its rows and
  the context (bucketed as sizing.py measures again), so that a later generation or batch need
  not measure a size again;
- hot starts (`checkout`, `publish`): what a method learns over a generation (its
  calibration, Token Recycling's adjacency matrix) as the last generation to end left it. A
  generation starts from a copy and hands its own back when it ends; no generation sees
  another's change while it runs.

None of it decides a token: the suffix index, the step costs and the hot starts only change
which drafts are verified.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from .suffix_index import SuffixIndex, remember_output

# step costs are kept per context bucket: one below BUCKET_BASE tokens, then one for each
# BUCKET_GROWTH times more (sizing.py measures again after such a move)
BUCKET_BASE = 1024
BUCKET_GROWTH = 1.25


def context_bucket(context: int) -> int:
    if context < BUCKET_BASE:
        return 0
    return 1 + int(math.log(context / BUCKET_BASE) / math.log(BUCKET_GROWTH))


class StepCostTable:
    """Measured seconds of target steps: (generations, rows, context bucket) -> the fastest seen."""

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self._seconds: dict[tuple[int, int, int], float] = {}

    def lookup(self, generations: int, rows: int, context: int) -> float | None:
        with self._lock:
            return self._seconds.get((generations, rows, context_bucket(context)))

    def record(self, generations: int, rows: int, context: int, seconds: float) -> None:
        key = (generations, rows, context_bucket(context))
        with self._lock:
            known = self._seconds.get(key)
            if known is None or seconds < known:
                self._seconds[key] = seconds

    def clear(self) -> None:
        with self._lock:
            self._seconds.clear()

    def fastest(self, rows: int) -> float | None:
        """The fastest step of one generation over `rows` rows at any context (None before
        any was measured)."""
        with self._lock:
            seen = [s for (g, r, _), s in self._seconds.items() if g == 1 and r == rows]
        return min(seen) if seen else None


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


class SharedState:
    """The state of one model that its generations share (see the module's docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.suffix_outputs = SuffixIndex()
        self.step_costs = StepCostTable(self._lock)
        self._hot: dict[tuple, Any] = {}

    def checkout(self, key: tuple, make: Callable[[], Any]) -> Any:
        """A generation's own copy of what was last published under `key` (`make()` when
        nothing was)."""
        with self._lock:
            found = self._hot.get(key)
            return make() if found is None else _copy(found)

    def publish(self, key: tuple, value: Any) -> None:
        """What a generation learned, for the generations that start after it."""
        with self._lock:
            self._hot[key] = _copy(value)

    def remember_output(self, output: list[int]) -> None:
        """Add a finished output to the suffix index of earlier outputs."""
        with self._lock:
            remember_output(self.suffix_outputs, output)

    def earlier_matches(self, committed: list[int], depth: int
                        ) -> tuple[int, list[list[int]]]:
        """The longest match of `committed`'s end among earlier outputs, and the continuations
        (at most `depth` tokens) of its occurrences."""
        with self._lock:
            return self.suffix_outputs.matched(committed, depth)

    def seen_earlier(self, committed: list[int]) -> bool:
        """Whether `committed`'s end occurs in earlier outputs (SuffixIndex.seen)."""
        with self._lock:
            return self.suffix_outputs.seen(committed)

    def forget_text(self) -> None:
        """Forget what generations learned of the text they wrote (the suffix index of earlier
        outputs, the hot starts), keeping what they measured of the machine (step costs)."""
        with self._lock:
            self.suffix_outputs = SuffixIndex()
            self._hot.clear()

    def clear(self) -> None:
        """Forget everything (a fresh model's state)."""
        self.step_costs.clear()
        self.forget_text()
