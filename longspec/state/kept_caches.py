"""Finished generations' KV caches, kept on a model for the generations after them: state the
generations on a model share (state/shared.py).

A fresh cache costs more than its size says: its buffers are zeroed on pages the process has
never touched, each faulted in, and a prompt-cache hit then copies into them (for 3,500
tokens of a 1.5B model's cache on two cores, 30 ms to zero a 5,600-slot cache and 64 ms to
restore into it, one time in several 250 ms to zero, against 28 ms to restore into a kept
cache's buffers). That is most of what an agent's next turn waits for before its first
token, when its prompt is all cached but for the turn's own tokens. And where the target's
steps are captured as CUDA graphs (models/graphs.py), a cache carries its captured steps,
which replay over its buffers only: `ar`'s generations one after another then capture one
graph in all, not one each.

A kept cache's slots hold an earlier generation's keys and values, all finite; a generation
writes every slot it attends to, and the padding slots past them that attention's chunks read
get probability 0 (models/attention.py), so a kept cache gives the bits a fresh one gives.
"""

from __future__ import annotations

import threading

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

    def take(self, capacity: int):
        """(cache, steps) of a kept cache of at least `capacity` slots, or None."""
        with self._lock:
            fits = [k for k in self._kept if k[0].slots >= capacity]
            if not fits:
                self._kept.clear()
                return None
            kept = min(fits, key=lambda k: k[0].slots)
            self._kept.remove(kept)
        kept[0].reuse(capacity)
        return kept

    def touched_for(self, capacity: int) -> int:
        """Slots already touched (StaticCache.touched) that a generation of `capacity` slots
        reuses (see `take`): where a kept cache holds it, that one's (at most `capacity`),
        else all of theirs (let go, their memory to the one allocated instead)."""
        with self._lock:
            fits = [cache for cache, _ in self._kept if cache.slots >= capacity]
            if fits:
                return min(min(fits, key=lambda c: c.slots).touched, capacity)
            return sum(cache.touched for cache, _ in self._kept)

    def __len__(self) -> int:
        return len(self._kept)

    def give(self, cache, steps) -> None:
        """Keep a finished generation's cache and steps."""
        with self._lock:
            self._kept.append((cache, steps))
            del self._kept[:-KEPT]
