"""Methods as data: each drafter module declares one `MethodSpec`, and everything that needs a
method's facts (the CLI, argument checks, option validation, the benchmark's columns, error
messages) reads them from here."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import SIZINGS, Budget, Drafter


@dataclass(frozen=True)
class Option:
    """A tuning option: an integer >= `minimum`, or one of `choices` when it has them."""

    default: int | str
    choices: tuple[str, ...] = ()
    minimum: int = 1

    def check(self, key: str, value) -> None:
        if self.choices:
            if value not in self.choices:
                raise ValueError(f"option {key} must be one of {', '.join(self.choices)}, "
                                 f"got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            rule = "an integer >= 0" if self.minimum == 0 else "a positive integer"
            raise ValueError(f"option {key} must be {rule}, got {value!r}")


@dataclass(frozen=True)
class DraftSetup:
    """What a method's `build` gets: the target, the generation's settings and its extras."""

    model: Any                 # the target Model
    budget: Budget
    options: Mapping[str, Any]  # the method's options, defaults filled in
    sampler: Any               # the generation's Sampler
    sizer: Any                 # the generation's Sizer: its step costs and calibration
    draft_model: Any | None
    heads: Any | None          # a path, loaded heads, or None for the bundled ones
    capacity: int              # slots of the target's KV cache
    context: int               # the longest sequence of this generation
    prediction: tuple[int, ...] = ()   # the output expected (prediction=), as token ids


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str                          # what it drafts from (CLI help, docs/methods.md)
    budget: Budget                        # default draft budget, measured (docs/benchmarks/)
    build: Callable[[DraftSetup], Drafter]
    options: Mapping[str, Option] = field(default_factory=dict)
    # "needed": it drafts with a draft model (draft, triforce); "optional": it adds one's drafts
    # to its own when given (auto); "": it takes none
    draft_model: str = ""
    # takes a trained drafter (heads=: multi-token heads or an EAGLE drafter); heads=None
    # takes the one bundled for the model, when there is (`auto` drafts without one if not)
    needs_heads: bool = False
    samples_drafts: bool = False          # drafts carry their distribution: verify="rejection"
    takes_prediction: bool = False        # drafts from a predicted output (prediction=)
    stats: tuple[str, ...] = ()           # method-specific keys of the result's stats

    @property
    def needs_draft_model(self) -> bool:
        return self.draft_model == "needed"

    @property
    def takes_draft_model(self) -> bool:
        return self.draft_model != ""

    @property
    def speculative(self) -> bool:
        return self.budget.max_nodes > 1

    def all_options(self) -> dict[str, Option]:
        """Tuning options with the draft budget's two (max_nodes, max_depth) first."""
        if not self.speculative:
            return dict(self.options)
        return {"max_nodes": Option(self.budget.max_nodes),
                "max_depth": Option(self.budget.max_depth),
                "sizing": Option(SIZINGS[0], choices=SIZINGS), **self.options}

    def resolve(self, options: Mapping | None) -> tuple[Budget, dict]:
        """The budget and tuning options, defaults overridden by `options`."""
        known = self.all_options()
        values = {key: opt.default for key, opt in known.items()}
        for key, value in (options or {}).items():
            if key not in known:
                allowed = ", ".join(sorted(known)) or "none"
                raise ValueError(f"method {self.name!r} takes no option {key!r}; "
                                 f"it takes: {allowed}")
            known[key].check(key, value)
            values[key] = value
        if not self.speculative:
            return self.budget, values
        if values["max_nodes"] < 2:
            raise ValueError("option max_nodes must be at least 2 (the root and one draft)")
        budget = Budget(values.pop("max_nodes"), values.pop("max_depth"), values.pop("sizing"))
        return budget, values


def parse_value(text: str) -> int | str:
    """An option's value from text: an integer when it reads as one, else the text."""
    text = text.strip()
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else text


def parse_assignment(pair: str, form: str = "KEY=VALUE") -> tuple[str, int | str]:
    """'KEY=VALUE' -> (key, value); a ValueError naming `form` otherwise."""
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"options take {form}, got {pair!r}")
    return key.strip(), parse_value(value)
