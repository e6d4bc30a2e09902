"""The contextual penalty window along tree paths equals a direct count over each node's window."""

import random

import pytest
import torch

from longspec.sampling.penalty import PenaltyWindow
from longspec.step.tree import DraftTree, TreeShape

pytestmark = pytest.mark.unit

V = 12


def window_tokens(seq, path, window):
    """Tokens that the logits after the last token of seq + path see."""
    full = seq + path
    return set(full[max(0, len(full) - window):])


@pytest.mark.parametrize("window", [1, 3, 8, 40])
@pytest.mark.parametrize("committed", [1, 5, 9, 30])
def test_tree_presence_equals_brute_force(window, committed):
    rng = random.Random(window * 100 + committed)
    seq = [rng.randrange(V) for _ in range(committed)]
    pw = PenaltyWindow(window, V, torch.device("cpu"))
    pw.extend(seq[:committed // 2])
    pw.extend(seq[committed // 2:])
    parents = [-1] + [rng.randrange(i) for i in range(1, 14)]
    tokens = [seq[-1]] + [rng.randrange(V) for _ in range(13)]
    tree = DraftTree(TreeShape(parents, torch.device("cpu")), torch.tensor(tokens))
    got = pw.presence(tree)
    for i in range(len(parents)):
        path, j = [], i
        while j > 0:
            path.append(tokens[j])
            j = parents[j]
        expect = window_tokens(seq, path[::-1], window)
        assert set(torch.nonzero(got[i]).flatten().tolist()) == expect


def test_window_counts_follow_long_commits():
    pw = PenaltyWindow(5, V, torch.device("cpu"))
    seq = []
    rng = random.Random(0)
    for n in [1, 3, 7, 2, 12, 1]:
        new = [rng.randrange(V) for _ in range(n)]
        seq += new
        pw.extend(new)
        expect = torch.bincount(torch.tensor(seq[-5:]), minlength=V).int()
        assert torch.equal(pw.counts, expect)


@pytest.mark.parametrize("window", [1, 4, 50])
def test_chain_presence_equals_brute_force(window):
    rng = random.Random(window)
    seq = [rng.randrange(V) for _ in range(20)]
    pw = PenaltyWindow(window, V, torch.device("cpu"))
    pw.extend(seq)
    for n in range(8):
        path = [rng.randrange(V) for _ in range(n)]
        got = set(torch.nonzero(pw.presence_after(path)[0]).flatten().tolist())
        assert got == window_tokens(seq, path, window)


@pytest.mark.parametrize("window", [2, 6, 50])
def test_extended_window_equals_committing_ahead_tokens(window):
    rng = random.Random(window + 7)
    seq = [rng.randrange(V) for _ in range(30)]
    ahead = [rng.randrange(V) for _ in range(4)]
    pw = PenaltyWindow(window, V, torch.device("cpu"))
    pw.extend(seq)
    view = pw.extended(ahead)
    ref = PenaltyWindow(window, V, torch.device("cpu"))
    ref.extend(seq + ahead)
    parents = [-1, 0, 1, 1, 2]
    tree = DraftTree(TreeShape(parents, torch.device("cpu")), torch.tensor([ahead[-1], 3, 4, 5, 3]))
    assert torch.equal(view.presence(tree), ref.presence(tree))
    assert torch.equal(view.presence_after([1, 2, 3]), ref.presence_after([1, 2, 3]))
    assert len(pw.tokens) == 30
