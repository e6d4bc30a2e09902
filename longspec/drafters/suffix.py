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

from ..state.suffix_index import SuffixIndex
from ..step.tree import Source, TrieBuilder
from .base import Budget, TrieDrafter
from .registry import MethodSpec

ALPHA = 1.0
MAX_DEPTH = 24
MIN_PROB = 0.1
UNSEEN = 2.0              # pseudo-count of other continuations, times 1 / match length


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
    plain_steps = True

    def __init__(self, model, device, prediction: tuple[int, ...] = ()):
        self.device = device
        self.shared = model.state
        self.local = SuffixIndex()
        self.indexes = [(Source.SUFFIX, self.local)]
        if prediction:
            self.indexes.append((Source.PREDICTION, SuffixIndex(list(prediction))))
        self.prompt_len = 0

    def prefill(self, prompt_ids: list[int], cache) -> None:
        self.local.extend(prompt_ids)
        self.prompt_len = len(prompt_ids)

    def add_drafts(self, trie: TrieBuilder, committed: list[int], budget: Budget) -> None:
        """Add this drafter's tree for the text `committed` to `trie` (used by `auto` too):
        from this text, the prediction, then earlier outputs."""
        self.local.extend(committed[len(self.local.tokens):])
        depth = min(budget.max_depth, MAX_DEPTH)
        found = [(source, *index.matched(committed, depth)) for source, index in self.indexes]
        found.append((Source.SUFFIX_EARLIER, *self.shared.earlier_matches(committed, depth)))
        for source, length, continuations in found:
            if length:
                cap = min(budget.max_nodes - 1, math.ceil(ALPHA * length))
                add_counted_tree(trie, continuations, cap, source, length)

    def repeats(self, committed: list[int]) -> bool:
        """Whether the text's last tokens occurred before, in it, in the prediction or in
        earlier outputs (SuffixIndex.seen): where they did not, every match is shorter
        than SuffixIndex's MAX_N tokens."""
        self.local.extend(committed[len(self.local.tokens):])
        return (any(index.seen(committed) for _, index in self.indexes)
                or self.shared.seen_earlier(committed))

    def finish(self, tokens: list[int]) -> None:
        self.shared.remember_output(tokens[self.prompt_len:])


SPEC = MethodSpec(
    name="suffix", summary="what followed the longest earlier match, weighted by frequency, "
    "from this text and earlier outputs (SuffixDecoding)",
    budget=Budget(32, MAX_DEPTH), takes_prediction=True,
    build=lambda setup: SuffixDrafter(setup.model, setup.model.device, setup.prediction))
