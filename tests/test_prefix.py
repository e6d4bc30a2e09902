"""Prefix invariance: the first tokens of a run are the same whatever max_new_tokens, the stop
strings or the method, because the arithmetic a position gets depends on the model, its kernel
profile and the position alone (docs/design.md, "What exactness rests on"). Runs of 2,300 new
tokens cross every length the code has known: attention's 256-position chunks, the prefill's
chunks (256 tokens on a CPU, 1,024 on a GPU), and 2,048 positions (where an earlier version's
compiled layers switched from loops to products); on a tiny model with 4K positions, dense
float32 and int4 (the compiled layers where a compiler is). CI runs the int4 run (marked
`profiles`: the int4 product, attention and the compiled layers of each profile) under every
kernel profile it can emulate (.ci/run). A prompt's cache is the same bits whatever the chunks
of its prefill."""

import functools

import pytest
import torch
from helpers import DEVICE, make_checkpoint

import longspec
from longspec.cache import StaticCache
from longspec.models.prefill import drain, prefilling

SHORT, LONG = 64, 2300
S = longspec.SamplingConfig
SETTINGS = {"greedy": S(temperature=0), "sampling": S(temperature=0.9, top_p=0.95)}
PROMPT = list(range(5, 45))
# the methods each slow case runs to LONG tokens (int4 weights sampled: `auto`, the fast run)
METHODS = {("float32", "greedy"): ("pld", "recycling"), ("float32", "sampling"): ("auto",),
           ("int4", "greedy"): ("auto",)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix")
    make_checkpoint(path, "qwen2", vocab=320, max_positions=4096, hidden=64, intermediate=128,
                    heads=4, kv_heads=2)
    return path


@functools.cache
def load(path, weights: str):
    load = {"quantize": "q4", "dtype": "bfloat16"} if weights == "int4" else {"dtype": weights}
    return longspec.load_model(path, device=DEVICE, **load)


def run(path, weights: str, setting: str, new_tokens: int, method: str = "ar", **kwargs):
    return longspec.generate(load(path, weights), PROMPT, max_new_tokens=new_tokens,
                             method=method, sampling=SETTINGS[setting], seed=7, ignore_eos=True,
                             **kwargs).token_ids


@pytest.mark.profiles
@pytest.mark.skipif(DEVICE != "cpu", reason="int4 weights run on a CPU (on CUDA they are dense)")
def test_int4_ar_prefix_does_not_depend_on_max_new_tokens(tiny_dir):
    assert load(tiny_dir, "int4").profile.weights == "int4"
    long = run(tiny_dir, "int4", "sampling", LONG)
    assert run(tiny_dir, "int4", "sampling", SHORT) == long[:SHORT]
    assert run(tiny_dir, "int4", "sampling", LONG, "auto") == long


@pytest.mark.slow
# int4 weights sampled: the fast tier's run above
@pytest.mark.parametrize("weights,setting", [("float32", "greedy"), ("float32", "sampling"),
                                             ("int4", "greedy")])
def test_every_length_and_method_agrees_on_the_prefix(tiny_dir, weights, setting):
    long = run(tiny_dir, weights, setting, LONG)
    for n in (1, SHORT, 2100):
        assert run(tiny_dir, weights, setting, n) == long[:n], n
    for method in METHODS[weights, setting]:
        assert run(tiny_dir, weights, setting, LONG, method) == long, method


def test_a_stop_token_leaves_the_tokens_before_it_as_they_were(tiny_dir):
    full = run(tiny_dir, "float32", "greedy", SHORT)
    cut = run(tiny_dir, "float32", "greedy", SHORT, "pld", stop=[full[40]])
    assert cut == full[:len(cut)] and len(cut) <= 41


@pytest.mark.profiles
@pytest.mark.parametrize("weights", ["float32", "int4"])
def test_the_prefill_chunks_do_not_change_the_cache(tiny_dir, weights):
    """A prompt prefilled whole, in chunks of 256 (a CPU's) and in chunks of 100 leaves the same
    keys and values, bit for bit, and the same logits after it."""
    if weights == "int4" and DEVICE != "cpu":
        pytest.skip("int4 weights run on a CPU (on CUDA they are dense)")
    model = load(tiny_dir, weights)
    ids = torch.randint(5, 300, (700,), generator=torch.Generator().manual_seed(0))

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)

    runs = []
    for chunk in (1024, 256, 100):
        cache = StaticCache(model.config, len(ids), model.dtype, model.device)
        logits = drain(prefilling(model.net, ids, cache, 0, last_logits=1, max_chunk=chunk))
        runs.append([bits(logits), *(bits(b[:, :len(ids)]) for b in (*cache.k, *cache.v))])
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
