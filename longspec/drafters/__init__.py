"""Drafters by method name, and each method's default draft budget."""

from __future__ import annotations

from .base import Budget, Drafter, NoDraft, TargetOutput
from .ngram import NgramDrafter
from .pld import PromptLookupDrafter
from .recycling import RecyclingDrafter

# method -> default budget (max tree nodes incl. root, max depth), measured in BENCHMARKS.md
BUDGETS = {
    "ar": Budget(1, 0),
    "pld": Budget(9, 8),
    "ngram": Budget(32, 3),
    "recycling": Budget(80, 6),
}


def method_names() -> tuple[str, ...]:
    return tuple(BUDGETS)


def default_budget(method: str) -> Budget:
    return BUDGETS[method]


def build_drafter(method: str, model, **options) -> Drafter:
    """The drafter of `method` for `model`; options not used by a method are ignored."""
    if method == "ar":
        return NoDraft(model.device)
    if method == "pld":
        return PromptLookupDrafter(model.device)
    if method == "ngram":
        return NgramDrafter(model.device, int(options["sampler"].config.penalty_window))
    if method == "recycling":
        return RecyclingDrafter(model)
    raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(method_names())}")


__all__ = ["Budget", "Drafter", "NoDraft", "TargetOutput", "build_drafter", "default_budget",
           "method_names"]
