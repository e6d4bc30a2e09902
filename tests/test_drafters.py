"""Drafter data structures against slow references; trie merging."""

import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from longspec.drafters.base import Budget
from longspec.drafters.ngram import NgramDrafter, NgramTable
from longspec.drafters.pld import NgramIndex
from longspec.drafters.suffix import SuffixDrafter
from longspec.state.shared import SharedState
from longspec.step.tree import TreeTemplate, TrieBuilder, template

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def brute_force_lookup(tokens, k, max_n=4):
    """Scan the whole text for the latest earlier occurrence of the longest suffix."""
    for n in range(min(max_n, len(tokens)), 0, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 2, n - 2, -1):   # occurrence ending before the suffix
            if tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


@pytest.mark.parametrize("seed", range(5))
def test_pld_index_equals_full_scan(seed):
    rng = random.Random(seed)
    index = NgramIndex()
    tokens = []
    for _ in range(300):
        new = [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        tokens += new
        index.extend(new)
        assert index.lookup(5) == brute_force_lookup(tokens, 5)


def test_ngram_table_top_k_equals_brute_force_counter_with_ties():
    rng = random.Random(0)
    table = NgramTable(top_k=5)
    seen = Counter()
    for step in range(3000):
        gram = (rng.randrange(3), rng.randrange(3), rng.randrange(4), rng.randrange(3))
        table.add(gram)
        seen[gram] += 1
        if step % 50 == 0:
            for first in range(3):
                expect = sorted((-c, g[1:]) for g, c in seen.items() if g[0] == first)[:5]
                assert table.continuations(first) == [rest for _, rest in expect]


def test_ngram_drafter_counts_the_prompt_and_what_left_the_window():
    d = NgramDrafter(CPU, window=4, top_k=3)
    d.prefill([9, 9, 9, 9, 9], None)
    d.sync([9] * 5 + [1, 2, 3, 4, 5, 6, 7])
    # 12 tokens, window 4: the 4-grams starting at 0..4 lie wholly in positions 0..7
    assert d.table.counts == {9: {(9, 9, 9): 2, (9, 9, 1): 1, (9, 1, 2): 1, (1, 2, 3): 1}}
    d.sync([9] * 5 + [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5])
    # 17 tokens: the 4-grams starting at 5..9 have left the window too
    assert d.table.continuations(1) == [(2, 3, 4)]
    assert d.table.continuations(2) == [(3, 4, 5)]
    assert d.table.continuations(5) == [(6, 7, 1)]
    tree = d.propose([9] * 5 + [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 1], Budget(8, 3))
    assert tree.tokens.tolist() == [1, 2, 3, 4]


def test_ngram_drafter_without_a_penalty_counts_everything_written():
    d = NgramDrafter(CPU, window=0, top_k=3)
    d.prefill([7, 1, 2, 3], None)
    d.sync([7, 1, 2, 3, 9, 1, 2])
    assert d.table.continuations(1) == [(2, 3, 9)]
    tree = d.propose([7, 1, 2, 3, 9, 1, 2, 3, 9, 1], Budget(8, 3))
    assert tree.tokens.tolist() == [1, 2, 3, 9]
    assert 0 < tree.scores[1] < 1 and tree.scores[3] < tree.scores[1]


def test_recycling_template_fill_equals_slow_reference():
    parents, ranks = template(80, 6)
    assert len(parents) == 80 and max(ranks) == 7
    tpl = TreeTemplate(80, 6, CPU)
    assert tpl.shape.max_depth == 6
    matrix = torch.randint(0, 1000, (1000, 8), generator=torch.Generator().manual_seed(0))
    tokens = tpl.fill_by_token(17, matrix).tolist()
    slow = [17]
    for i in range(1, 80):
        slow.append(int(matrix[slow[parents[i]], ranks[i]]))
    assert tokens == slow


def test_recycling_template_gives_higher_ranks_more_children():
    parents, _ = template(80, 6)
    kids = Counter(parents[1:])
    first_child_of_root = parents.index(0)
    last_child_of_root = max(i for i, p in enumerate(parents) if p == 0)
    assert kids[first_child_of_root] >= kids[last_child_of_root]


def test_trie_merge_dedupes_shared_prefixes_and_respects_budget():
    trie = TrieBuilder(root=5, max_nodes=7, max_depth=3)
    trie.add_chain([1, 2, 3])
    trie.add_chain([1, 2, 4])
    trie.add_chain([1, 7])
    trie.add_tree([-1, 0, 0], [1, 2, 9])    # 1 -> {2, 9}: only 9 is new
    trie.add_chain([8, 8, 8, 8])             # over budget: one node fits
    tree = trie.build(CPU)
    assert tree.tokens.tolist() == [5, 1, 2, 3, 4, 7, 9]
    assert tree.shape.parents == [-1, 0, 1, 2, 2, 1, 1]
    deep = TrieBuilder(root=0, max_nodes=10, max_depth=2)
    deep.add_chain([1, 2, 3, 4])
    assert deep.build(CPU).shape.max_depth == 2


def test_suffix_drafts_a_long_copy_as_a_deep_chain_and_a_short_match_as_a_guess():
    """A passage of the prompt being copied back: once the match is long, what followed it
    once is drafted the budget's full depth; after a 1-token match, a few tokens at most."""
    rng = random.Random(0)
    passage = [rng.randrange(100, 1000) for _ in range(200)]

    def drafted(answer: list[int]):
        drafter = SuffixDrafter(SimpleNamespace(state=SharedState()), CPU)
        drafter.prefill([1, 2, *passage, 3], None)
        return drafter.propose([1, 2, *passage, 3, *answer], Budget(48, 24))

    tree = drafted(passage[:40])
    assert tree.tokens.tolist() == [passage[39], *passage[40:64]]
    assert tree.scores[-1] > 0.3
    tree = drafted([7, passage[0]])            # matches the passage's first token only
    assert 1 < tree.n <= 3 and tree.scores[1] < 0.5


def test_suffix_repeats_says_whether_the_texts_end_occurred_before_in_any_index():
    """The O(1) test before a lookup: the text's last four tokens seen earlier in the text,
    in the prediction or in earlier outputs; never the text's own end."""
    shared = SharedState()
    drafter = SuffixDrafter(SimpleNamespace(state=shared), CPU, prediction=(50, 51, 52, 53, 54))
    drafter.prefill([1, 2, 3, 4, 5, 6], None)
    assert not drafter.repeats([1, 2, 3, 4, 5, 6])
    assert drafter.repeats([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4])
    assert drafter.repeats([1, 2, 3, 4, 5, 6, 50, 51, 52, 53])
    assert not drafter.repeats([1, 2, 3, 4, 5, 6, 51, 52, 53, 54])   # the prediction's end
    shared.remember_output([20, 21, 22, 23, 24])
    assert drafter.repeats([1, 2, 3, 4, 5, 6, 20, 21, 22, 23])
    assert not drafter.repeats([1, 2, 3, 4, 5, 6, 21, 22, 24, 23])
