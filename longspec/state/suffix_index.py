"""Occurrences of every n-gram of a growing token sequence: SuffixDecoding's index
(drafters/suffix.py), one per generation's text and prediction, and one over earlier outputs
that the generations on a model share (state/shared.py)."""

from __future__ import annotations

from array import array

MAX_N = 4                 # n-grams indexed; longer matches are found by extending backwards
MAX_MATCH = 64
MAX_OCCURRENCES = 64
OUTPUTS_CAP = 1 << 18     # tokens of earlier outputs kept process-wide (per model)
SEPARATOR = -1            # between earlier outputs: no n-gram spans two of them


class SuffixIndex:
    """Occurrences of every n-gram (n = 1..MAX_N) of a growing token sequence, newest first:
    `_last[n]` maps an n-gram's hash to the end of its latest occurrence (the index just past
    it, where its continuation starts), `_prev[n][end]` gives the occurrence before."""

    def __init__(self, tokens: list[int] = ()):
        self.tokens: list[int] = []
        self._last: list[dict[int, int]] = [{} for _ in range(MAX_N + 1)]
        self._prev = [array("l", [-1]) for _ in range(MAX_N + 1)]
        self.extend(list(tokens))

    def extend(self, tokens: list[int]) -> None:
        toks = self.tokens
        for token in tokens:
            toks.append(token)
            end = len(toks)
            for n in range(1, MAX_N + 1):
                if n > end or toks[end - n] == SEPARATOR:
                    self._prev[n].append(-1)
                    continue
                key = hash(tuple(toks[end - n:end]))
                self._prev[n].append(self._last[n].get(key, -1))
                self._last[n][key] = end

    def matches(self, suffix: list[int]) -> tuple[int, list[int]]:
        """The longest match length of `suffix`'s end among this sequence's occurrences, and
        where the continuations of those longest matches start (latest first). An occurrence
        must have a continuation: one ending at the sequence's end does not count."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(MAX_N, len(suffix)), 0, -1):
            end = self._last[n].get(hash(tuple(suffix[-n:])), -1)
            found: list[tuple[int, int]] = []
            while end >= 0 and len(found) < MAX_OCCURRENCES:
                if end < size and toks[end - n:end] == suffix[-n:]:   # not a hash collision
                    length = n
                    while (length < MAX_MATCH and length < len(suffix) and end - length > 0
                           and toks[end - length - 1] == suffix[-length - 1]):
                        length += 1
                    found.append((length, end))
                end = self._prev[n][end]
            if found:
                best = max(length for length, _ in found)
                return best, [end for length, end in found if length == best]
        return 0, []

    def seen(self, suffix: list[int]) -> bool:
        """Whether `suffix`'s last MAX_N tokens occur in this sequence with a continuation: a
        test in O(1) before `matches` (a hash collision may answer True)."""
        if len(suffix) < MAX_N:
            return False
        end = self._last[MAX_N].get(hash(tuple(suffix[-MAX_N:])), -1)
        if end == len(self.tokens):        # the sequence's own end: no continuation
            end = self._prev[MAX_N][end]
        return end >= 0

    def matched(self, suffix: list[int], depth: int) -> tuple[int, list[list[int]]]:
        """The longest match of `suffix`'s end, and the continuations (at most `depth` tokens)
        of its occurrences."""
        length, starts = self.matches(suffix)
        return length, (self.continuations(starts, depth) if length else [])

    def continuations(self, starts: list[int], depth: int) -> list[list[int]]:
        out = []
        for start in starts:
            cont = self.tokens[start:start + depth]
            if SEPARATOR in cont:
                cont = cont[:cont.index(SEPARATOR)]
            if cont:
                out.append(cont)
        return out


def remember_output(index: SuffixIndex, output: list[int]) -> None:
    """Add a finished output to the index of earlier outputs, keeping the newest OUTPUTS_CAP
    tokens (rebuilt from the newer half when full, so each token is re-indexed O(1) times)."""
    if not output:
        return
    if len(index.tokens) + len(output) > OUTPUTS_CAP:
        index.__init__(index.tokens[len(index.tokens) // 2:])
    index.extend([SEPARATOR, *output[-OUTPUTS_CAP // 2:]])
