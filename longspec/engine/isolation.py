"""One member's failure in a step of several generations (engine/batching.py): caught, recorded by
its engine, and the member left out of the rest of the step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def guarded(failed: dict[int, Exception], engine: object, call: Callable[[], T]) -> T | None:
    """call()'s value, or None where it raises: the member has failed (failed[id(engine)])."""
    try:
        return call()
    except Exception as e:      # noqa: BLE001 (the member's generation ends with it)
        failed[id(engine)] = e
        return None


def alive(failed: dict[int, Exception], engines: list, *columns: list) -> tuple:
    """The engines that have not failed, and each column's entries for them."""
    keep = [i for i, e in enumerate(engines) if id(e) not in failed]
    return tuple([column[i] for i in keep] for column in (engines, *columns))
