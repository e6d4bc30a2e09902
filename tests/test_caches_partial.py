"""Caches that keep part of the history: partial (TokenSwift), retrieval (TriForce), streaming."""

import pytest
import torch
from helpers import assert_matches_ar, make_checkpoint

import longspec
from longspec.cache import StaticCache, causal_mask
from longspec.cache.partial import PartialCache
from longspec.cache.retrieval import RetrievalCache
from longspec.cache.scoring import group_scores
from longspec.cache.streaming import StreamingCache

F32 = torch.float32


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gqa")
    make_checkpoint(path, "llama", heads=4, kv_heads=2, max_positions=512)
    m = longspec.load_model(path, dtype="float32", device="cpu")
    return m


def filled_full_cache(model, n, seed=0):
    ids = torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed))
    full = StaticCache(model.config, n + 8, F32, "cpu")
    model.net(ids, torch.arange(n), full, causal_mask(n, F32, "cpu"))
    full.commit(n)
    return full


def test_group_scores_equal_replicated_key_reference():
    q = torch.randn(8, 16)
    keys = torch.randn(2, 50, 16)
    replicated = keys.repeat_interleave(4, dim=0)               # [8, 50, 16]: head h uses kv h // 4
    reference = torch.einsum("hd,hnd->hn", q, replicated).view(2, 4, 50).sum(1)
    assert torch.allclose(group_scores(q, keys), reference, atol=1e-4)


def random_queries(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(model.config.num_heads, model.config.head_dim, generator=g)
            for _ in range(model.config.num_layers)]


def test_partial_cache_keeps_sink_ranks_by_importance_and_respects_budget(model):
    full = filled_full_cache(model, 200)
    queries = random_queries(model)
    pc = PartialCache(model.config, budget=48, dtype=F32, device="cpu", sink=16)
    pc.rank(full, queries)
    assert pc.filled == 48 and pc.covered == 200 and pc.rankings == 1
    for layer in range(model.config.num_layers):
        assert torch.equal(pc.k[layer][:, :16], full.k[layer][:, :16])          # sink kept
        scores = group_scores(queries[layer], full.k[layer][:, 16:200])
        best = torch.topk(scores, 32, dim=1).indices + 16
        for h in range(model.config.num_kv_heads):
            expect = full.k[layer][h, best[h]]                                # most important first
            assert torch.equal(pc.k[layer][h, 16:48], expect)
    # new tokens overwrite from the tail inwards; the budget never grows
    full2 = filled_full_cache(model, 230)
    pc.append_from(full2, 210)
    assert pc.tail == 38 and pc.room() == 38 - 16
    assert torch.equal(pc.k[0][:, 38:48], full2.k[0][:, 200:210])
    assert pc.plan(1, None).n_keys == 48
    pc.append_from(full2, 230)
    assert pc.room() == 2
    with pytest.raises(RuntimeError, match="rank it again"):
        pc.plan(3, None)


def test_tokenswift_ranks_again_when_the_tail_reaches_the_sink(model):
    from longspec.heads import MultiTokenHeads

    heads = MultiTokenHeads(model.config.hidden_size)
    prompt = list(range(1, 101))
    res = assert_matches_ar(model, prompt, "tokenswift", 60, options={"partial_budget": 40},
                            heads=heads, sampling=longspec.SamplingConfig(temperature=0))
    # 24 free slots after each ranking, one scratch slot kept for the draft pass
    assert res.stats["partial_rankings"] >= 60 // 24 + 1


def test_partial_cache_short_history_is_copied_whole(model):
    full = filled_full_cache(model, 30)
    pc = PartialCache(model.config, budget=64, dtype=F32, device="cpu")
    pc.rank(full, random_queries(model))
    assert pc.filled == 30 and torch.equal(pc.v[1][:, :30], full.v[1][:, :30])
    assert pc.plan(2, None).start == 30


def test_retrieval_cache_keeps_first_chunk_and_best_chunks_within_budget(model):
    full = filled_full_cache(model, 203)                     # 25 whole chunks + 3 recent tokens
    queries = random_queries(model)
    rc = RetrievalCache(model.config, budget=64, tail=32, dtype=F32, device="cpu")
    rc.rebuild(full, lambda: queries)
    assert rc.length == 56 + 3 <= 64 and rc.covered == 203    # 7 chunks + the incomplete one
    for layer in range(model.config.num_layers):
        means = full.k[layer][:, :200].view(2, 25, 8, -1).mean(2)
        scores = group_scores(queries[layer], means)
        scores[:, 0] = float("inf")
        best = torch.topk(scores, 7, dim=1).indices.sort(dim=1).values
        for h in range(2):
            slots = (best[h][:, None] * 8 + torch.arange(8)).flatten()
            assert torch.equal(rc.k[layer][h, :56], full.k[layer][h, slots])
            assert 0 in best[h].tolist()                      # first chunk always kept
        assert torch.equal(rc.k[layer][:, 56:59], full.k[layer][:, 200:203])
    full2 = filled_full_cache(model, 210)
    rc.append_from(full2, 210)
    assert rc.length == 66 and rc.covered == 210
    # a rebuild on the same history restores the same selection
    before = [k[:, :56].clone() for k in rc.k]
    rc.rebuild(full, lambda: queries)
    assert all(torch.equal(b, k[:, :56]) for b, k in zip(before, rc.k))


def test_retrieval_cache_with_short_history_equals_full_cache(model):
    full = filled_full_cache(model, 40)
    rc = RetrievalCache(model.config, budget=64, tail=16, dtype=F32, device="cpu")
    rc.rebuild(full, lambda: random_queries(model))
    assert rc.length == 40 and torch.equal(rc.k[0][:, :40], full.k[0][:, :40])


def test_streaming_cache_keeps_sink_and_recent_window_at_positions_within_it(model):
    sc = StreamingCache(model.config, window=20, slack=40, dtype=F32, device="cpu",
                        rotate=model.net.rotate_keys, sink=4)
    ids = torch.randint(0, 300, (50,), generator=torch.Generator().manual_seed(3))
    model.net(ids, torch.arange(50), sc, causal_mask(50, F32, "cpu"))
    sc.commit(50)
    keys = sc.k[0][:, :50].clone()
    values = sc.v[0][:, :50].clone()
    sc.trim()
    assert sc.length == 24
    assert torch.equal(sc.k[0][:, :4], keys[:, :4])
    assert torch.equal(sc.v[0][:, 4:24], values[:, 30:50])
    # the first layer's keys depend on the token and its position alone: the moved keys are
    # those of the same tokens written at slots 4..23
    fresh = StaticCache(model.config, 24, F32, "cpu")
    model.net(ids[30:50], torch.arange(4, 24), fresh, causal_mask(20, F32, "cpu"))
    assert torch.allclose(sc.k[0][:, 4:24], fresh.k[0][:, :20], atol=1e-5)
    sc.trim()
    assert sc.length == 24