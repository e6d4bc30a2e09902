"""What the generations on one model share, and nothing else.

A generation owns its KV cache (while it runs), its drafters' tables and the step costs
measured at its own context. What it shares with the other generations on its model lives
here, typed, behind one lock, so generations on several threads (or interleaved on one) may
use it at once:

- `suffix_outputs`: the suffix index of earlier outputs (suffix_index.py), which every finished
  generation adds its output to and every generation drafts from;
- `step_costs`: seconds of a target step, keyed by the generations in the step, its rows and
  the context (bucketed as step/sizing.py measures again), so that a later generation or batch need
  not measure a size again; kept across processes in a file of longspec's cache directory
  (`StepCostTable.keep_in`), so that a process does not measure them again either;
- hot starts (`checkout`, `publish`): what a method learns over a generation (its
  calibration, Token Recycling's adjacency matrix) as the last generation to end left it. A
  generation starts from a copy and hands its own back when it ends; no generation sees
  another's change while it runs;
- `prompt_cache`: the keys and values of earlier sequences by token prefix, which a
  generation copies instead of computing its prompt's (state/prompt_cache.py; load_model bounds it);
- `captures`: what capturing a static step costs on this model, in eager runs of it
  (state/captures.py), and `kept_caches`: finished generations' KV caches (with their
  captured steps), for the generations after them (state/kept_caches.py).

None of it decides a token: the suffix index, the step costs and the hot starts only change
which drafts are verified, the prompt cache holds the bits a prefill would write, and a kept
cache gives the bits a fresh one gives.
"""

from __future__ import annotations

import copy
import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .captures import Captures
from .kept_caches import KeptCaches
from .prompt_cache import PromptCache
from .suffix_index import SuffixIndex, remember_output

# step costs are kept per context bucket: one below BUCKET_BASE tokens, then one for each
# BUCKET_GROWTH times more (step/sizing.py measures again after such a move)
BUCKET_BASE = 1024
BUCKET_GROWTH = 1.25


# keys a step-cost file keeps, the latest saved (every new code digest or model makes one)
FILE_KEYS = 32


def context_bucket(context: int) -> int:
    if context < BUCKET_BASE:
        return 0
    return 1 + int(math.log(context / BUCKET_BASE) / math.log(BUCKET_GROWTH))


class StepCostTable:
    """Measured seconds of target steps: (generations, rows, context bucket) -> the fastest seen.

    `keep_in` reads what earlier processes timed for the same host, kernel profile, model and
    threads (a key in one JSON file), and `save` writes this process's timings back. An entry
    read counts until this process times a step of it, whose seconds then replace it, faster
    or not (then the fastest seen, as always): carried over as the fastest ever, the entries
    would sink to the luckiest timing of every earlier run, which a busier machine would not
    see again. Measured on SmolLM2 (2 cores, T=0.7, 512 tokens): an `auto` answer took 2.65 s
    in a process that timed its step costs and 2.34 s in the next, which read them here."""

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self._seconds: dict[tuple[int, int, int], float] = {}
        self._read: set[tuple[int, int, int]] = set()   # from the file, not timed here yet
        self._file: tuple[Path, str] | None = None
        self._unsaved = False

    def lookup(self, generations: int, rows: int, context: int) -> float | None:
        with self._lock:
            return self._seconds.get((generations, rows, context_bucket(context)))

    def record(self, generations: int, rows: int, context: int, seconds: float) -> None:
        key = (generations, rows, context_bucket(context))
        with self._lock:
            known = self._seconds.get(key)
            if known is None or seconds < known or key in self._read:
                self._seconds[key] = seconds
                self._read.discard(key)
                self._unsaved = True

    def keep_in(self, path: Path, key: str) -> None:
        """Take the entries kept under `key` in the JSON file at `path` (see the class's
        docstring), and keep this process's there (`save`)."""
        with self._lock:
            self._file = (path, key)
            kept = _read_json(path).get(key)
            for entry, seconds in (kept.items() if isinstance(kept, dict) else ()):
                try:
                    at, seconds = tuple(int(v) for v in entry.split()), float(seconds)
                except (TypeError, ValueError):
                    continue                 # an entry not written by `save`: left out
                if len(at) == 3 and at not in self._seconds:
                    self._seconds[at] = seconds
                    self._read.add(at)

    def save(self) -> None:
        """Write the entries timed in this process to the file of `keep_in`, over what other
        processes wrote there for them; a file that cannot be written is left as it is."""
        with self._lock:
            if self._file is None or not self._unsaved:
                return
            path, key = self._file
            known = _read_json(path)
            mine = {**known.pop(key, {}),
                    **{" ".join(map(str, at)): seconds
                       for at, seconds in self._seconds.items() if at not in self._read}}
            known = {k: known[k] for k in list(known)[-(FILE_KEYS - 1):]}   # the latest saved
            known[key] = mine
            try:
                write_json(path, known)
                self._unsaved = False
            except OSError:
                pass

    def clear(self) -> None:
        """Forget every entry, those read from the file too (it is not changed)."""
        with self._lock:
            self._seconds.clear()
            self._read.clear()

    def fastest(self, rows: int) -> float | None:
        """The fastest step of one generation over `rows` rows at any context (None before
        any was measured)."""
        with self._lock:
            seen = [s for (g, r, _), s in self._seconds.items() if g == 1 and r == rows]
        return min(seen) if seen else None


def _read_json(path: Path) -> dict:
    """The JSON object in the file at `path`; empty where it is missing or unreadable."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_json(path: Path, value: Any) -> None:
    """Replace the file at `path` with `value` as JSON at once (a reader sees the old file or
    the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


class SharedState:
    """The state of one model that its generations share (see the module's docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.suffix_outputs = SuffixIndex()
        self.step_costs = StepCostTable(self._lock)
        self.captures = Captures()
        self.kept_caches = KeptCaches()
        self.prompt_cache = PromptCache()
        # llguidance's tokenizer for the model (outputs/grammar.py)
        self.grammar_tokenizer = None
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
        outputs, the hot starts, the prompt cache), keeping what they measured of the machine
        (step costs, what a capture costs)."""
        with self._lock:
            self.suffix_outputs = SuffixIndex()
            self._hot.clear()
        self.prompt_cache.clear()

    def clear(self) -> None:
        """Forget everything (a fresh model's state)."""
        self.step_costs.clear()
        self.captures = Captures()
        self.kept_caches = KeptCaches()
        self.forget_text()
