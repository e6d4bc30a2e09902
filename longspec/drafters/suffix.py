"""SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): draft what followed the longest
earlier match of the text's end, as a tree weighted by how often each continuation occurred.

Two indexes are searched: one over this generation's prompt and output, updated per committed
token in O(1), and a bounded one over earlier outputs on the same model (so a second run on
similar text starts warm); a third, with a predicted output (prediction=, OpenAI's predicted
outputs: a file to be returned with an edit), over the prediction: where the output leaves it
(the edit), the match is lost, and found again at the prediction's text once the output
rejoins it. The occurrences of the longest match (up to MAX_OCCURRENCES of the latest) give
continuations; they are merged into a counted trie, expanded best-first by the continuation
frequencies, capped at ALPHA x match length nodes and MAX_DEPTH levels, dropping paths less
likely than MIN_PROB (vLLM's defaults: depth 24, alpha 1.0, 0.1).

A continuation's frequency is smoothed by a pseudo-count of "something else" that shrinks as
the match backing it grows (UNSEEN over its length, the drafts before it included): a token
that followed a 1-token match once is a guess (1/3), one that followed a 40-token match once is
a copy (0.95). With one pseudo-count whatever the match (1/2 for a lone continuation), paths
fell under MIN_PROB after 3 tokens, so a module returned with an edit, copied from the prompt,
was drafted 3 tokens a step (3.6 tokens a step on Qwen2.5-Coder-1.5B).
"""

from __future__ import annotations

import heapq
import math
from array import array

from ..tree import TrieBuilder
from .base import Budget, TrieDrafter
from .registry import MethodSpec

MAX_N = 4                 # n-grams indexed; longer matches are found by extending backwards
MAX_MATCH = 64
MAX_OCCURRENCES = 64
ALPHA = 1.0
MAX_DEPTH = 24
MIN_PROB = 0.1
UNSEEN = 2.0              # pseudo-count of other continuations, times 1 / match length
OUTPUTS_CAP = 1 << 18     # tokens of earlier outputs kept process-wide (per model)
SEPARATOR = -1            # between earlier outputs: no n-gram spans two of them
LOCAL, EARLIER, PREDICTED = 0, 1, 2   # sources of a node, calibrated apart


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

    def continuations(self, starts: list[int], depth: int) -> list[list[int]]:
        out = []
        for start in starts:
            cont = self.tokens[start:start + depth]
            if SEPARATOR in cont:
                cont = cont[:cont.index(SEPARATOR)]
            if cont:
                out.append(cont)
        return out


def add_counted_tree(trie: TrieBuilder, continuations: list[list[int]], max_nodes: int,
                     source: int, length: int) -> None:
    """Merge the continuations of a match of `length` tokens into a counted trie and add its
    most frequent paths to `trie`, best-first by path probability (counts smoothed by UNSEEN
    over the match length a node extends), at most `max_nodes` of them."""
    children: list[dict[int, int]] = [{}]
    counts = [0]
    for cont in continuations:
        node = 0
        for token in cont:
            nxt = children[node].get(token)
            if nxt is None:
                nxt = children[node][token] = len(counts)
                children.append({})
                counts.append(0)
            counts[nxt] += 1
            node = nxt
    heap = [(-1.0, 0, 0, length)]   # (-path probability, counted node, trie node, match length)
    added = 0
    while heap and added <= max_nodes:
        neg, node, at, matched = heapq.heappop(heap)
        if node:
            added += 1
            if added > max_nodes:
                break
        total = sum(counts[c] for c in children[node].values()) + UNSEEN / matched
        for token, child in children[node].items():
            prob = counts[child] / total
            if -neg * prob < MIN_PROB:
                continue
            placed = trie.child(at, token, prob, source)
            if placed is not None:
                heapq.heappush(heap, (neg * prob, child, placed, matched + 1))


class SuffixDrafter(TrieDrafter):
    def __init__(self, model, device, prediction: tuple[int, ...] = ()):
        self.device = device
        self.local = SuffixIndex()
        self.earlier: SuffixIndex = model.state.setdefault("suffix_outputs", SuffixIndex())
        self.indexes = [(LOCAL, self.local), (EARLIER, self.earlier)]
        if prediction:
            self.indexes.insert(1, (PREDICTED, SuffixIndex(list(prediction))))
        self.prompt_len = 0

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.local.extend(prompt_ids)
        self.prompt_len = len(prompt_ids)

    def add_drafts(self, trie: TrieBuilder, committed: list[int], budget: Budget) -> None:
        """Add this drafter's tree for the text `committed` to `trie` (used by `auto` too)."""
        self.local.extend(committed[len(self.local.tokens):])
        depth = min(budget.max_depth, MAX_DEPTH)
        for source, index in self.indexes:
            length, starts = index.matches(committed)
            if length:
                cap = min(budget.max_nodes - 1, math.ceil(ALPHA * length))
                add_counted_tree(trie, index.continuations(starts, depth), cap, source, length)

    def finish(self, tokens: list[int]) -> None:
        remember_output(self.earlier, tokens[self.prompt_len:])


def remember_output(index: SuffixIndex, output: list[int]) -> None:
    """Add a finished output to the index of earlier outputs, keeping the newest OUTPUTS_CAP
    tokens (rebuilt from the newer half when full, so each token is re-indexed O(1) times)."""
    if not output:
        return
    if len(index.tokens) + len(output) > OUTPUTS_CAP:
        index.__init__(index.tokens[len(index.tokens) // 2:])
    index.extend([SEPARATOR, *output[-OUTPUTS_CAP // 2:]])


SPEC = MethodSpec(
    name="suffix", summary="what followed the longest earlier match, weighted by frequency, "
    "from this text and earlier outputs (SuffixDecoding)",
    budget=Budget(32, MAX_DEPTH), takes_prediction=True,
    build=lambda setup: SuffixDrafter(setup.model, setup.model.device, setup.prediction))
