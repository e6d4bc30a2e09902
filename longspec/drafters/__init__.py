"""The methods: every module of this package that declares a `SPEC` is one, so adding a
method is adding one file."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Budget, Drafter
from .registry import DraftSetup, MethodSpec, Option


def _collect() -> dict[str, MethodSpec]:
    """Each module's SPEC by method name: `ar` first, then alphabetically."""
    specs = {}
    for info in pkgutil.iter_modules(__path__):
        spec = vars(importlib.import_module(f"{__name__}.{info.name}")).get("SPEC")
        if isinstance(spec, MethodSpec):
            specs[spec.name] = spec
    return {name: specs[name] for name in sorted(specs, key=lambda n: (n != "ar", n))}


METHODS = _collect()
VERIFY_MODES = ("match", "rejection")


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def get_method(name) -> MethodSpec:
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


def _those(has) -> str:
    """The names of the methods for which has(spec) holds."""
    return ", ".join(name for name, spec in METHODS.items() if has(spec))


def check_arguments(spec: MethodSpec, *, draft_model: bool, heads: bool, verify: str,
                    prediction: bool = False) -> None:
    """Refuse extras the method does not use (before anything is loaded)."""
    if prediction and not spec.takes_prediction:
        raise ValueError(f"method {spec.name!r} drafts nothing from a prediction; methods that "
                         f"do: {_those(lambda s: s.takes_prediction)}")
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    if draft_model and not spec.takes_draft_model:
        raise ValueError(f"method {spec.name!r} takes no draft model; methods that do: "
                         f"{_those(lambda s: s.takes_draft_model)}")
    if heads and not spec.needs_heads:
        raise ValueError(f"method {spec.name!r} takes no heads; methods that do: "
                         f"{_those(lambda s: s.needs_heads)}")
    if verify == "rejection" and not spec.samples_drafts:
        raise ValueError(f"method {spec.name!r} does not sample its drafts, so verify='rejection' "
                         f"does not apply; methods that do: {_those(lambda s: s.samples_drafts)}")


__all__ = ["METHODS", "VERIFY_MODES", "Budget", "DraftSetup", "Drafter", "MethodSpec", "Option",
           "check_arguments", "get_method", "method_names"]
