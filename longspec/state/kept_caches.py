"""Finished generations' KV caches, kept on a model for the generations after them: state the
generations on a model share (state/shared.py).

A fresh cache costs more than its size says: its pages are the process's only once touched,
each faulted in. Behind `longspec serve` on two cores, an agent's second turn (3,549 of its
3,591 tokens in the prompt cache, a 1.5B model) spent 265-300 ms zeroing a fresh 6,656-slot
cache and 87 ms restoring its prefix into it; on uninitialized buffers the restore alone
took 148-199 ms; into a kept cache's touched pages, 29-38 ms. That was most of what the turn
waited for before its first token. And where the target's steps are captured as CUDA graphs
(models/graphs.py), a cache carries its captured steps, which replay over its buffers only:
`ar`'s generations one after another then capture one graph in all, not one each.

A kept cache's slots hold an earlier generation's keys and values or zeros, all finite; a
generation writes every slot it attends to, and the padding slots past them that attention's
chunks read (zeroed where untouched, cache/base.py) get probability 0 (models/attention.py),
so a kept cache gives the bits a fresh one gives.
"""

from __future__ import annotations

import threading

from ..device.memory import ensure_fits

# finished generations' caches kept on a model: a batch of up to this many members, replaced
# as they end, takes every one of them again
KEPT = 8


class KeptCaches:
    """Finished generations' KV caches, each with its static steps (graphs.py: StaticSteps,
    captured over that cache; None where there are none), kept on one model. A generation
    takes the smallest kept cache whose buffers hold it (StaticCache.reuse: they are
    allocated in whole chunks of slots, on the CPU with room to grow, cache/base.py, so a
    prompt longer than the last may still fit). At most KEPT are kept; where none holds a
    new generation, all are let go (their memory to the one allocated instead). Safe to use
    from several threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept: list = []       # (cache, steps), the earliest kept first

    def _holding(self, capacity: int):
        """The smallest kept (cache, steps) of at least `capacity` slots, or None (under the
        lock)."""
        fits = [k for k in self._kept if k[0].slots >= capacity]
        return min(fits, key=lambda k: k[0].slots) if fits else None

    def take(self, capacity: int):
        """(cache, steps) of a kept cache of at least `capacity` slots, or None."""
        with self._lock:
            kept = self._holding(capacity)
            if kept is None:
                self._kept.clear()
                return None
            self._kept.remove(kept)
        kept[0].reuse(capacity)
        return kept

    def touched_for(self, capacity: int) -> int:
        """Slots already touched (StaticCache.touched) that a generation of `capacity` slots
        reuses (see `take`): where a kept cache holds it, that one's (at most `capacity`),
        else all of theirs (let go, their memory to the one allocated instead)."""
        with self._lock:
            kept = self._holding(capacity)
            if kept is not None:
                return min(kept[0].touched, capacity)
            return sum(cache.touched for cache, _ in self._kept)

    def ensure_fits(self, capacity: int, slot_bytes: int, device, what: str, fix: str) -> None:
        """Raise ValueError (device/memory.py: ensure_fits) when a cache of `capacity` slots of
        `slot_bytes` each would not fit, less what the kept cache it takes, or all of them
        where none holds it, already touched (`touched_for`)."""
        ensure_fits((capacity - self.touched_for(capacity)) * slot_bytes, device, what, fix)

    def __len__(self) -> int:
        return len(self._kept)

    def give(self, cache, steps) -> None:
        """Keep a finished generation's cache and steps."""
        with self._lock:
            self._kept.append((cache, steps))
            del self._kept[:-KEPT]
