"""Finished generations' KV caches kept on a model (state/kept_caches.py): the next generation
takes one that holds it, and writes what it writes on a fresh cache."""

from types import SimpleNamespace

import pytest
import torch
from helpers import DEVICE
from test_lossless import SETTINGS, models, prompts

import longspec
from longspec.cache import StaticCache
from longspec.cache.base import CHUNK
from longspec.request import encode_prompt
from longspec.state.kept_caches import KEPT, KeptCaches

pytestmark = pytest.mark.usefixtures("costs_that_pay")


@pytest.mark.unit
def test_a_kept_cache_goes_to_the_next_generation_it_holds():
    config = SimpleNamespace(num_kv_heads=2, head_dim=4, num_layers=3)

    def cache(capacity):
        made = StaticCache(config, capacity, torch.float32, DEVICE)
        made.plan(capacity - 3, None)
        made.commit(capacity - 3)
        return made

    kept = KeptCaches()
    small, large = cache(CHUNK - 20), cache(2 * CHUNK)
    kept.give(large, "large's steps")
    kept.give(small, "small's steps")
    assert kept.touched_for(2 * CHUNK) == 2 * CHUNK      # large's: it takes that one
    # the smallest whose buffers hold it (whole chunks: slots past its last capacity)
    assert kept.take(CHUNK - 5) == (small, "small's steps")
    assert (small.length, small.capacity) == (0, CHUNK - 5)
    assert kept.take(CHUNK + 1) == (large, "large's steps") and len(kept) == 0
    kept.give(small, None)
    assert kept.touched_for(CHUNK + 1) == CHUNK      # small's whole chunk: let go
    assert kept.take(CHUNK + 1) is None and len(kept) == 0     # none holds it: all let go
    for _ in range(KEPT + 2):
        kept.give(cache(8), None)
    assert len(kept) == KEPT


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int4"])
@pytest.mark.parametrize("method", ["ar", "auto"])
def test_a_generation_on_a_kept_cache_writes_what_it_writes_on_a_fresh_one(method, dtype):
    """The kept cache holds a longer sequence's keys and values past the slots the next
    generation writes, in the chunk its attention reads."""
    target, _ = models(dtype)
    text = prompts()["tqdm"]
    longer, shorter = encode_prompt(target, text[:900]), encode_prompt(target, text[300:700])
    settings = {"max_new_tokens": 24, "method": method, "seed": 4, "ignore_eos": True,
                "sampling": SETTINGS["sampling_min_p_penalty"]}
    target.state.clear()
    fresh = longspec.generate(target, shorter, **settings).token_ids
    target.state.clear()
    longspec.generate(target, longer, **settings)
    (cache, _), = target.state.kept_caches._kept
    target.state.prompt_cache.clear()
    after = longspec.generate(target, shorter, **settings)
    assert after.stats["cached_tokens"] == 0 and after.token_ids == fresh
    assert target.state.kept_caches._kept[0][0] is cache      # taken, and given back at its end


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's caches are allocated uninitialized")
@pytest.mark.parametrize("dtype", ["float32", "int4"])
@pytest.mark.parametrize("method", ["ar", "auto"])
def test_a_cache_on_memory_holding_anything_writes_what_it_writes_on_zeros(monkeypatch, method,
                                                                          dtype):
    """A fresh cache's buffers are not zeroed (cache/base.py): filled with NaN, as memory an
    earlier owner left may be, they give the same tokens, so every slot attention reads is
    written or zeroed first."""
    target, _ = models(dtype)
    prompt = encode_prompt(target, prompts()["tqdm"][:700])
    settings = {"max_new_tokens": 24, "method": method, "seed": 4, "ignore_eos": True,
                "sampling": SETTINGS["sampling_min_p_penalty"]}
    target.state.clear()
    plain = longspec.generate(target, prompt, **settings).token_ids
    made = StaticCache.__init__

    def poisoned(self, *args, **kwargs):
        made(self, *args, **kwargs)
        assert self.finite == 0
        for buf in (*self.k, *self.v):
            buf.fill_(float("nan"))

    monkeypatch.setattr(StaticCache, "__init__", poisoned)
    target.state.clear()
    assert longspec.generate(target, prompt, **settings).token_ids == plain


def test_a_draft_models_cache_is_kept_for_its_next_generation():
    target, draft = models("float32")
    prompt = encode_prompt(target, prompts()["tqdm"][:500])
    settings = {"max_new_tokens": 24, "method": "draft", "draft_model": draft, "seed": 4,
                "ignore_eos": True, "sampling": SETTINGS["sampling_min_p_penalty"]}
    draft.state.clear()
    fresh = longspec.generate(target, prompt, **settings).token_ids
    (cache, steps), = draft.state.kept_caches._kept
    assert steps is None
    draft.state.prompt_cache.clear()
    assert longspec.generate(target, prompt, **settings).token_ids == fresh
    assert draft.state.kept_caches._kept == [(cache, None)]     # taken, and given back
