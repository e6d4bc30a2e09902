"""Drafters by method name, and each method's default draft budget."""

from __future__ import annotations

from .base import Budget, Drafter, NoDraft, TargetOutput
from .draft_model import DraftModelDrafter
from .heads import HeadsDrafter
from .ngram import TOP_K, NgramDrafter
from .pld import PromptLookupDrafter
from .recycling import RecyclingDrafter
from .retrieval_level import REBUILD_EVERY, RETRIEVAL_BUDGET
from .selfspec import SelfSpecDrafter
from .tokenswift import DRAFT_PASSES, PARTIAL_BUDGET, PARTIAL_MODES, TokenSwiftDrafter
from .triforce import GAMMA1, STREAMING_WINDOW, TriForceDrafter

# method -> default budget (max tree nodes incl. root, max depth), measured in BENCHMARKS.md
BUDGETS = {
    "ar": Budget(1, 0),
    "pld": Budget(5, 4),
    "ngram": Budget(7, 3),
    "recycling": Budget(16, 4),
    "draft": Budget(9, 8),
    "selfspec": Budget(9, 8),
    "triforce": Budget(13, 12),
    "heads": Budget(6, 3),
    "tokenswift": Budget(12, 4),
}
NEEDS_DRAFT_MODEL = ("draft", "triforce")
# tuning options each method takes besides max_nodes and max_depth (positive integers, or
# one of the listed strings)
OPTIONS = {
    "tokenswift": {"draft_pass": DRAFT_PASSES[0], "partial_mode": PARTIAL_MODES[0],
                   "partial_budget": PARTIAL_BUDGET,
                   "ngram_top_k": TOP_K, "heads_nodes": 39},
    "ngram": {"top_k": TOP_K},
    "selfspec": {"retrieval_budget": RETRIEVAL_BUDGET, "rebuild_every": REBUILD_EVERY},
    "triforce": {"retrieval_budget": RETRIEVAL_BUDGET, "rebuild_every": REBUILD_EVERY,
                 "gamma1": GAMMA1, "streaming_window": STREAMING_WINDOW},
}


def method_names() -> tuple[str, ...]:
    return tuple(BUDGETS)


# options that take one of a few names
CHOICES = {"draft_pass": DRAFT_PASSES, "partial_mode": PARTIAL_MODES}
# options where 0 is meaningful (no n-gram chains: the ablation of TokenSwift's paper)
ZERO_OK = ("top_k", "ngram_top_k")


def option_names(method: str) -> set[str]:
    names = set(OPTIONS.get(method, {}))
    return names | {"max_nodes", "max_depth"} if method != "ar" else names


def resolve_options(method: str, options: dict | None) -> tuple[Budget, dict]:
    """The method's budget and tuning options, defaults overridden by `options`."""
    budget = BUDGETS[method]
    known = {**OPTIONS.get(method, {})}
    if method != "ar":
        known.update(max_nodes=budget.max_nodes, max_depth=budget.max_depth)
    for key, value in (options or {}).items():
        if key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ValueError(f"method {method!r} takes no option {key!r}; it takes: {allowed}")
        if key in CHOICES:
            if value not in CHOICES[key]:
                raise ValueError(f"option {key} must be one of {', '.join(CHOICES[key])}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < (0 if key in ZERO_OK else 1):
            raise ValueError(f"option {key} must be a positive integer, got {value!r}")
        known[key] = value
    if method != "ar":
        if known["max_nodes"] < 2:
            raise ValueError("option max_nodes must be at least 2 (the root and one draft)")
        budget = Budget(known.pop("max_nodes"), known.pop("max_depth"))
    return budget, known


def build_drafter(method: str, model, budget: Budget, options: dict, *, sampler, draft_model=None,
                  heads=None, capacity: int, context: int) -> Drafter:
    """The drafter of `method` for `model`. `capacity` is the target cache's size and
    `context` the longest sequence of this generation."""
    if method == "ar":
        return NoDraft(model.device)
    if method == "pld":
        return PromptLookupDrafter(model.device)
    if method == "ngram":
        return NgramDrafter(model.device, int(sampler.config.penalty_window), options["top_k"])
    if method == "recycling":
        return RecyclingDrafter(model)
    if method == "draft":
        return DraftModelDrafter(model, draft_model, sampler, capacity, context)
    if method == "selfspec":
        return SelfSpecDrafter(model, sampler, options["retrieval_budget"], options["rebuild_every"],
                               budget.max_depth)
    if method == "triforce":
        return TriForceDrafter(model, draft_model, sampler, context, options["retrieval_budget"],
                               options["rebuild_every"], budget.max_depth, options["gamma1"],
                               options["streaming_window"])
    if method == "heads":
        return HeadsDrafter(model, heads, sampler)
    if method == "tokenswift":
        return TokenSwiftDrafter(model, heads, sampler, options["draft_pass"], options["partial_budget"],
                                 options["ngram_top_k"], options["heads_nodes"], options["partial_mode"])
    raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(method_names())}")


__all__ = ["NEEDS_DRAFT_MODEL", "Budget", "Drafter", "NoDraft", "TargetOutput", "build_drafter",
           "method_names", "option_names", "resolve_options"]
