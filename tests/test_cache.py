"""The static cache: chunked prefill, decode, tree blocks and compaction agree with one forward."""

import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.cache import StaticCache, causal_mask
from longspec.step.tree import DraftTree, TreeShape

F32 = torch.float32


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama")
    m = longspec.load_model(path, dtype="float32", device="cpu")
    return m


def full_forward(model, ids):
    cache = StaticCache(model.config, len(ids), F32, "cpu")
    return model.net(ids, torch.arange(len(ids)), cache, causal_mask(len(ids), F32, "cpu")).logits


def test_chunked_prefill_then_decode_equals_one_full_forward(model):
    ids = torch.randint(0, 300, (50,), generator=torch.Generator().manual_seed(0))
    ref = full_forward(model, ids)
    cache = StaticCache(model.config, 64, F32, "cpu")
    logits = []
    for lo, hi in [(0, 17), (17, 40)]:
        out = model.net(ids[lo:hi], torch.arange(lo, hi), cache, causal_mask(hi - lo, F32, "cpu"))
        cache.commit(hi - lo)
        logits.append(out.logits)
    for t in range(40, 50):
        logits.append(model.net(ids[t:t + 1], torch.tensor([t]), cache).logits)
        cache.commit(1)
    assert torch.allclose(torch.cat(logits), ref, atol=1e-5, rtol=0)


def test_tree_step_then_keep_then_decode_equals_sequential_decode(model):
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1))
    # a tree whose accepted chain 0 -> 2 -> 4 is not contiguous in the block
    parents = [-1, 0, 0, 1, 2, 2]
    chain = [0, 2, 4]
    tokens = torch.tensor([7, 11, 13, 17, 19, 23])
    shape = TreeShape(parents, torch.device("cpu"))
    cache = StaticCache(model.config, 64, F32, "cpu")
    model.net(ids, torch.arange(30), cache, causal_mask(30, F32, "cpu"))
    cache.commit(30)
    tree_out = model.net(tokens, shape.depth + 30, cache, shape.mask(F32)).logits
    cache.keep(chain)
    after = model.net(torch.tensor([29]), torch.tensor([33]), cache).logits

    seq = torch.cat([ids, tokens[chain], torch.tensor([29])])
    ref = full_forward(model, seq)
    assert torch.allclose(tree_out[chain], ref[30:33], atol=1e-5, rtol=0)
    assert torch.allclose(after[0], ref[33], atol=1e-5, rtol=0)
    assert cache.length == 33


def test_rollback_discards_uncommitted_block(model):
    cache = StaticCache(model.config, 16, F32, "cpu")
    cache.commit(5)
    cache.rollback(3)
    assert cache.length == 3
    with pytest.raises(RuntimeError, match="KV cache full"):
        cache.plan(14, None)


@pytest.mark.unit
def test_draft_tree_mask_positions_and_paths():
    parents = [-1, 0, 0, 1, 1, 2, 3]
    shape = TreeShape(parents, torch.device("cpu"))
    assert shape.depths == [0, 1, 1, 2, 2, 2, 3]
    assert shape.paths[6].tolist() == [0, 1, 3, 6]
    assert shape.paths[2].tolist() == [0, 2, -1, -1]
    expected = torch.zeros(7, 7, dtype=torch.bool)
    for i in range(7):
        j = i
        while j >= 0:
            expected[i, j] = True
            j = parents[j]
    assert torch.equal(shape.ancestors, expected)
    mask = shape.mask(F32)
    assert torch.equal(mask == 0, expected) and torch.isinf(mask[~expected]).all()
    tree = DraftTree(shape, torch.arange(7))
    assert tree.n == 7
