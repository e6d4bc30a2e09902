"""The prompt cache (state/prompt_cache.py): a request that starts as an earlier sequence on the
model started, its prompt or its answer, copies those keys and values instead of computing them, and
writes exactly the tokens a fresh run writes, every method greedy and sampled (in the slow tier; the
fast tier runs three methods in bfloat16 and with int4 weights), alone and in a batch; the cache
never holds more than its bound. CI runs the tests marked `profiles` (`auto` in bfloat16 and with
int4 weights, a batch with int4 weights) under every kernel profile it can emulate (.ci/run)."""

from types import SimpleNamespace

import pytest
import torch
from helpers import DEVICE
from test_lossless import METHODS, OPTIONS, SETTINGS, models, prompts

import longspec
from longspec.cache import StaticCache
from longspec.request import encode_prompt
from longspec.state.prompt_cache import BLOCK, PromptCache

pytestmark = pytest.mark.usefixtures("costs_that_pay")
NEW_TOKENS = 24


def run(dtype: str, prompt, entry: str, setting: str, drafter=None, seed: int = 5):
    target, draft = models(dtype)
    method = entry.split("[")[0]
    return longspec.generate(
        target, prompt, max_new_tokens=NEW_TOKENS, method=method, sampling=SETTINGS[setting],
        seed=seed, ignore_eos=True, heads=drafter, options=OPTIONS.get(entry),
        draft_model=(draft if longspec.METHODS[method].needs_draft_model
                     or entry == "auto[draft]" else None))


@pytest.fixture
def drafter(request, method):
    return request.getfixturevalue("demo_eagle") if method in ("eagle", "auto[eagle]") else None


def check_next_turn_matches_a_fresh_run(dtype: str, method: str, setting: str, drafter):
    """A first generation, then a prompt made of its prompt, its answer and more: the second
    reuses the first's keys and values (the answer's computed as draft trees and plain steps)
    and writes what the same request writes with nothing cached."""
    target, _ = models(dtype)
    cache = target.state.prompt_cache
    cache.clear()
    prompt = encode_prompt(target, prompts()["tqdm"][:400])
    first = run(dtype, prompt, method, setting, drafter)
    follow = prompt + first.token_ids + prompt[3:20]
    hit = run(dtype, follow, method, setting, drafter, seed=6)
    assert hit.stats["cached_tokens"] == len(prompt) + NEW_TOKENS - 1
    cache.clear()
    fresh = run(dtype, follow, method, setting, drafter, seed=6)
    assert fresh.stats["cached_tokens"] == 0
    assert hit.token_ids == fresh.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["greedy_penalty", "sampling_min_p_penalty"])
@pytest.mark.parametrize("method", METHODS)
def test_a_cache_hit_writes_what_a_fresh_run_writes(method, setting, drafter):
    check_next_turn_matches_a_fresh_run("float32", method, setting, drafter)


@pytest.mark.parametrize("dtype", ["bfloat16", "int4"])
@pytest.mark.parametrize("method", ["ar", pytest.param("auto", marks=pytest.mark.profiles),
                                    "tokenswift"])
def test_a_cache_hit_writes_what_a_fresh_run_writes_in_bfloat16(method, dtype, drafter):
    check_next_turn_matches_a_fresh_run(dtype, method, "sampling_min_p_penalty", drafter)


def test_a_draft_models_keys_serve_it_as_a_target_too():
    """A draft model keeps the keys and values of the committed tokens it drafted over in its
    own prompt cache: used as a target later, it writes what it writes with nothing cached."""
    target, draft = models("float32")
    draft.state.prompt_cache.clear()
    prompt = encode_prompt(target, prompts()["tqdm"][:400])
    first = run("float32", prompt, "draft", "sampling_min_p_penalty")
    follow = prompt + first.token_ids + prompt[:9]
    settings = {"max_new_tokens": 24, "method": "ar", "seed": 4, "ignore_eos": True,
                "sampling": SETTINGS["sampling_min_p_penalty"]}
    hit = longspec.generate(draft, follow, **settings)
    assert hit.stats["cached_tokens"] > len(prompt)
    draft.state.prompt_cache.clear()
    fresh = longspec.generate(draft, follow, **settings)
    assert fresh.stats["cached_tokens"] == 0 and hit.token_ids == fresh.token_ids


@pytest.mark.parametrize("dtype", ["float32", pytest.param("int4", marks=pytest.mark.profiles)])
def test_a_batch_sharing_a_prefix_writes_what_each_writes_alone(dtype):
    """Lines sharing a long first part (a system prompt, a document) in one batch: the later
    ones copy it from the first one's prefill; each writes its own tokens alone, uncached."""
    target, _ = models(dtype)
    document = encode_prompt(target, prompts()["transformers"][:600])
    lines = [document + encode_prompt(target, f"\n# question {i}: ") for i in range(3)]
    settings = {"max_new_tokens": 24, "method": "auto", "seed": 2, "ignore_eos": True,
                "sampling": SETTINGS["sampling_min_p_penalty"]}
    target.state.prompt_cache.clear()
    together = longspec.generate_many(target, lines, max_batch=3, **settings)
    assert [r.stats["cached_tokens"] >= len(document) - BLOCK for r in together] == [
        False, True, True]
    for line, res in zip(lines, together):
        target.state.prompt_cache.clear()
        alone = longspec.generate(target, line, **settings)
        assert alone.stats["cached_tokens"] == 0 and alone.token_ids == res.token_ids


def kv_cache(length: int, seed: int, layers: int = 3) -> StaticCache:
    config = SimpleNamespace(num_kv_heads=2, head_dim=4, num_layers=layers)
    cache = StaticCache(config, length, torch.float32, DEVICE)
    gen = torch.Generator().manual_seed(seed)
    for buf in (*cache.k, *cache.v):
        buf.copy_(torch.randn(buf.shape, generator=gen))
    cache.commit(length)
    return cache


def restored(pc: PromptCache, tokens: list[int], capacity: int = 300) -> tuple[int, StaticCache]:
    cache = kv_cache(capacity, 0)
    cache.rollback(0)
    return pc.restore(tokens, cache), cache


@pytest.mark.unit
def test_the_longest_common_prefix_is_restored_to_the_token():
    pc = PromptCache(2**20)
    seq = list(range(100, 150))
    source = kv_cache(len(seq), 1)
    pc.store(seq, source)
    for tokens, expect in [(seq, 50), (seq[:37] + [7, 8], 37), (seq[:16] + [1], 16),
                           ([5] + seq, 0), (seq[:3], 3)]:
        n, cache = restored(pc, tokens)
        assert n == expect and cache.length == n
        for mine, theirs in zip((*cache.k, *cache.v), (*source.k, *source.v)):
            assert torch.equal(mine[:, :n], theirs[:, :n])
    # a longer sequence through the same blocks replaces the partial last block it extends
    longer = seq + list(range(10))
    pc.store(longer, kv_cache(len(longer), 1))
    assert restored(pc, longer)[0] == len(longer)
    assert len(pc) == -(-len(longer) // BLOCK)


@pytest.mark.unit
def test_the_bound_holds_under_a_stream_of_distinct_prompts():
    per_token = 2 * 3 * 2 * 4 * 4
    limit = 200 * per_token
    pc = PromptCache(limit)
    shared = list(range(1000, 1032))          # every prompt's first two blocks
    for i in range(40):
        seq = shared + [i] * (20 + i % 7)
        pc.store(seq, kv_cache(len(seq), i))
        assert pc.bytes <= limit
        assert restored(pc, seq)[0] == len(seq)             # the latest is whole
        assert restored(pc, shared + [i])[0] == len(shared) + 1
    assert pc.evicted_blocks > 0
    assert restored(pc, shared + [0] * 20)[0] == len(shared)    # the oldest went
    # a sequence larger than the bound is kept as far as it fits
    big = list(range(5000, 5000 + 400))
    pc.store(big, kv_cache(len(big), 9))
    assert pc.bytes <= limit and 0 < restored(pc, big)[0] < len(big)
    pc.resize(0)
    assert pc.bytes == 0 and len(pc) == 0


def test_prompt_cache_mb_is_checked():
    for bad in (-1, "1", True):
        with pytest.raises(ValueError, match="prompt_cache_mb must be a number of MiB"):
            longspec.load_model("demo", prompt_cache_mb=bad)
    off = longspec.load_model("demo", dtype="float32", prompt_cache_mb=0)
    res = longspec.generate(off, "def f(x):", max_new_tokens=4)
    again = longspec.generate(off, "def f(x):", max_new_tokens=4)
    assert res.stats["cached_tokens"] == again.stats["cached_tokens"] == 0
