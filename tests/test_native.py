"""The compiled decoder layers (models/native.cpp) write exactly what the Python layers write:
the same logits, queries and cache, bit for bit, for chains and draft trees, for every kind of
product (Q4_1, Q8_0 as two halves, biases, dense products beside int4 ones) and for Qwen3's
query and key norms."""

import pytest
import torch
from gguf_writer import write_gguf
from helpers import make_checkpoint

import longspec
from longspec.cache import StaticCache
from longspec.models.native import _extension
from longspec.models.prefill import prefill
from longspec.tree import TreeShape

pytestmark = pytest.mark.skipif(_extension() is None,
                                reason="the compiled layers cannot be built here (no compiler)")


def int4_models(path, family: str, monkeypatch):
    """(compiled, python) loads of one int4 model of `family`."""
    kind = {"llama-q4_1": ("llama", "Q4_1"), "llama-q8_0": ("llama", "Q8_0")}.get(family)
    # sizes that give a GQA group of 3, as SmolLM2 has
    hf = make_checkpoint(path / "hf", kind[0] if kind else family, hidden=192, intermediate=512,
                         heads=6, kv_heads=2, vocab=320, max_positions=1024)
    if kind:
        write_gguf(hf, path / "m.gguf", kind[1])
        load = {"path": path / "m.gguf"}
    else:
        load = {"path": path / "hf", "quantize": "q4"}
    compiled = longspec.load_model(**load, device="cpu")
    monkeypatch.setenv("LONGSPEC_NATIVE", "0")
    python = longspec.load_model(**load, device="cpu")
    assert compiled.net.native is not None and python.net.native is None
    return compiled, python


def forward(model, cache, tokens, positions, mask):
    out = model.net(tokens, positions, cache, mask, return_queries=True)
    return out.logits, out.queries, [t.clone() for t in cache.k + cache.v]


@pytest.mark.parametrize("family", ["llama-q4_1", "llama-q8_0", "qwen2", "qwen3"])
def test_compiled_layers_equal_the_python_layers_bitwise(tmp_path, monkeypatch, family):
    compiled, python = int4_models(tmp_path, family, monkeypatch)
    context = 300                    # past one attention chunk
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 320, (context,), generator=g)
    caches = []
    for model in (compiled, python):
        model.net.set_context(context + 40)
        cache = StaticCache(model.config, context + 40, model.dtype, "cpu")
        prefill(model.net, prompt, cache, 0)
        caches.append(cache)
    tokens = torch.randint(0, 320, (40,), generator=g)
    trees = [TreeShape.chain(q - 1, torch.device("cpu")) for q in (1, 2, 5, 16, 40)]
    trees.append(TreeShape([-1, 0, 0, 1, 1, 2, 4, 4, 6, 3], torch.device("cpu")))
    for shape in trees:
        q = len(shape.depth)
        block = (tokens[:q], shape.depth + context, shape.mask(torch.bfloat16))
        ours, theirs = (forward(m, c, *block) for m, c in zip((compiled, python), caches))
        assert torch.equal(ours[0], theirs[0]), f"logits differ for {q} nodes"
        assert all(map(torch.equal, ours[1], theirs[1])), f"queries differ for {q} nodes"
        assert all(map(torch.equal, ours[2], theirs[2])), f"caches differ for {q} nodes"
