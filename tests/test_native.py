"""The operator longspec::attention and the compiled decoder layers (models/native.cpp), for
every kind of product (every weight format the loader keeps quantized, on longspec::int4_mm and
on ATen's int4 kernel; mixes of formats in one product; biases; dense products beside int4 ones,
at shapes off the int4 kernels' tiles) and for Qwen3's query and key norms:
- the compiled layers write exactly what the Python layers (Block.forward with the operator)
  write: the same logits, queries and cache, bit for bit, for chains and draft trees;
- every row of a chain or a tree is bitwise what its token gets run alone after its ancestors,
  and against float32 the logits are no further off than twice attention.py's products';
- heads not of a multiple of 16 take the products, in Python."""

import pytest
import torch
from gguf_writer import write_gguf
from helpers import make_checkpoint
from torch import library

import longspec
from longspec.cache import StaticCache
from longspec.models import build, linear
from longspec.models.attention import block_order
from longspec.models.compiled import int4_mm
from longspec.models.linear import DenseLinear, Int4Linear, RowParts, inner_products
from longspec.models.prefill import prefill
from longspec.step.tree import TreeShape

pytestmark = [pytest.mark.compiled, pytest.mark.profiles]


def int4_models(path, family: str):
    """(compiled, python) loads of one int4 model of `family`."""
    kind = {"llama-q4_1": ("llama", "Q4_1"), "llama-q8_0": ("llama", "Q8_0"),
            "llama-q4_1-head48": ("llama", "Q4_1"),
            "llama-q4_1-head64": ("llama", "Q4_1")}.get(family)
    # sizes that give a GQA group of 3, as SmolLM2 has; heads of 32, 48 (the loops without a
    # head size known when compiled) or 64 (SmolLM2's, one the loops are compiled for)
    hidden = {"head48": 288, "head64": 384}.get(family.rsplit("-", 1)[-1], 192)
    hf = make_checkpoint(path / "hf", kind[0] if kind else family, hidden=hidden,
                         intermediate=512, heads=6, kv_heads=2, vocab=320, max_positions=1024)
    return loads(hf, path, kind[1] if kind else "q4")


def loads(hf, path, weights: str | dict[str, str]):
    """(compiled, python) loads of the checkpoint `hf` saved in path / "hf": its matrices in a
    GGUF file of `weights` (write_gguf's formats), or "q4": quantized at load. The Python ones
    run the same int4 kernel and attention."""
    if weights == "q4":
        load = {"path": path / "hf", "quantize": "q4"}
    else:
        write_gguf(hf, path / "m.gguf", weights)
        load = {"path": path / "m.gguf"}
    compiled = longspec.load_model(**load, device="cpu")
    if compiled.net.native is None and inner_products(torch.bfloat16, torch.device("cpu")):
        pytest.skip("dense bfloat16 products run as oneDNN's inner product on this CPU, which "
                    "the compiled layers do not make")
    python = longspec.load_model(**load, device="cpu")
    python.net.native = None
    assert compiled.net.native is not None and python.net.attention == "loops"
    return compiled, python


def forward(model, cache, tokens, positions, mask):
    out = model.net(tokens, positions, cache, mask, return_queries=True)
    return out.logits, out.queries, [t.clone() for t in cache.k + cache.v]


FAMILIES = ["llama-q4_1", "llama-q8_0", "qwen2", "qwen3-head48"]
CONTEXT = 300                    # past one attention chunk


def prefilled(model) -> StaticCache:
    cache = StaticCache(model.config, CONTEXT + 40, model.dtype, "cpu")
    prompt = torch.randint(0, 320, (CONTEXT,), generator=torch.Generator().manual_seed(0))
    prefill(model.net, prompt, cache, 0)
    return cache


def blocks():
    """(tokens, shape) of chains of 1, 2, 5, 16 and 40 tokens and a draft tree."""
    tokens = torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(1))
    shapes = [TreeShape.chain(q - 1, torch.device("cpu")) for q in (1, 2, 5, 16, 40)]
    shapes.append(TreeShape([-1, 0, 0, 1, 1, 2, 4, 4, 6, 3], torch.device("cpu")))
    return [(tokens[:len(shape.depth)], shape) for shape in shapes]


def assert_forwards_equal_bitwise(compiled, python) -> None:
    """The compiled layers' logits, queries and cache are the Python layers', bit for bit, for
    every block of `blocks()` after the same context."""
    caches = [prefilled(model) for model in (compiled, python)]
    for tokens, shape in blocks():
        q = len(shape.depth)
        block = (tokens, shape.depth + CONTEXT, shape.mask(torch.bfloat16))
        ours, theirs = (forward(m, c, *block) for m, c in zip((compiled, python), caches))
        assert torch.equal(ours[0], theirs[0]), f"logits differ for {q} nodes"
        assert all(map(torch.equal, ours[1], theirs[1])), f"queries differ for {q} nodes"
        assert all(map(torch.equal, ours[2], theirs[2])), f"caches differ for {q} nodes"


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_layers_equal_the_python_layers_bitwise(tmp_path, family):
    assert_forwards_equal_bitwise(*int4_models(tmp_path, family))


# Every format the loader keeps quantized (quant.py: Q6_K where longspec::int4_mm runs, else
# dense, so that a file of Q6_K alone leaves the compiled layers no int4 product there), and
# mixes: llama.cpp's Q4_K_M (q|k in Q4_K beside v in Q6_K: one product of two parts where
# int4_mm runs, else dense), and q|k beside v in another format on either int4 kernel, with a
# dense product (F16) beside them
FORMATS = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q8_0": "Q8_0", "Q5_0": "Q5_0", "Q4_K": "Q4_K",
           "Q5_K": "Q5_K", "Q6_K": "Q6_K",
           "Q4_K_M": {"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K"},
           "Q4_0+Q8_0+F16": {"default": "Q4_0", "attn_v": "Q8_0", "ffn_down": "F16"}}


@pytest.mark.parametrize("weights,kernel", [(w, k) for w in sorted(FORMATS)
                                            for k in ("int4_mm", "aten")
                                            if (w, k) != ("Q6_K", "aten")])  # dense: no int4
def test_compiled_layers_equal_the_python_layers_bitwise_in_every_weight_format(
        tmp_path, monkeypatch, weights, kernel):
    """Heads of 64 (K-quants' superblocks of 256 take hidden and intermediate sizes of a
    multiple of 256), int4 products on longspec::int4_mm and on ATen's kernel (the one CPUs
    without AVX2 run)."""
    if kernel == "int4_mm" and not int4_mm():
        pytest.skip("longspec::int4_mm is built for CPUs with AVX2 or AVX-512 only")
    for module in (build, linear):
        monkeypatch.setattr(module, "int4_mm", lambda: kernel == "int4_mm")
    hf = make_checkpoint(tmp_path / "hf", "llama", hidden=256, intermediate=512, heads=4,
                         kv_heads=2, vocab=320, max_positions=1024)
    compiled, python = loads(hf, tmp_path, FORMATS[weights])
    assert compiled.profile.int4_kernel == kernel
    if weights == "Q4_0+Q8_0+F16":
        assert isinstance(compiled.net.layers[0].wqkv, RowParts)
        assert isinstance(compiled.net.layers[0].w_down, DenseLinear)
    assert_forwards_equal_bitwise(compiled, python)


@pytest.mark.parametrize("weights", ["q4", {"default": "Q4_0", "ffn_down": "F16"}],
                         ids=["quantized at load", "Q4_0+F16"])
@pytest.mark.parametrize("intermediate", [165, 168])
def test_compiled_layers_equal_the_python_layers_bitwise_at_shapes_off_the_tiles(
        tmp_path, weights, intermediate):
    """Intermediate sizes of 16k + 5 and 16k + 8: a gate|up product of 16k + 10 outputs
    (dense: the int4 kernels take outputs in tiles of 16), or of 16k (int4, though neither part
    is a whole number of tiles), and a down product over K of neither a multiple of 32 nor of
    16 (dense: the int4 kernels take K in groups of 32); a vocabulary of 16k + 5."""
    hf = make_checkpoint(tmp_path / "hf", "llama", hidden=192, intermediate=intermediate,
                         heads=6, kv_heads=2, vocab=325, max_positions=1024)
    compiled, python = loads(hf, tmp_path, weights)
    layer = compiled.net.layers[0]
    assert isinstance(layer.wqkv, Int4Linear) and isinstance(layer.w_down, DenseLinear)
    assert isinstance(layer.w_gate_up, Int4Linear if intermediate == 168 else DenseLinear)
    assert_forwards_equal_bitwise(compiled, python)


def alone(model, cache, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] of the tokens run one at a time after the context."""
    rows = []
    for i, token in enumerate(tokens):
        rows.append(model.net(torch.tensor([token]), torch.tensor([CONTEXT + i]), cache).logits[0])
        cache.commit(1)
    cache.rollback(CONTEXT)
    return torch.stack(rows)


@pytest.mark.parametrize("family", [*FAMILIES, "llama-q4_1-head48", "llama-q4_1-head64"])
def test_loop_attention_rows_equal_tokens_run_alone(tmp_path, family):
    compiled, python = int4_models(tmp_path, family)
    python.net.attention = "products"
    reference = longspec.load_model(tmp_path / "m.gguf", device="cpu", dtype="float32",
                                    dequantize=True) if family.startswith("llama") else None
    reference = reference or longspec.load_model(tmp_path / "hf", device="cpu", dtype="float32")
    caches = [prefilled(model) for model in (compiled, python, reference)]
    cache = caches[0]
    for tokens, shape in blocks():
        q = len(shape.depth)
        out = compiled.net(tokens, shape.depth + CONTEXT, cache, shape.mask(torch.bfloat16))
        for node in range(q):
            path = [int(n) for n in shape.paths[node] if n >= 0]
            ref = alone(compiled, cache, tokens[path].tolist())[-1]
            assert torch.equal(out.logits[node], ref), f"node {node} of {q} differs"
        # against float32 on the same weights, no further off than the product path's logits,
        # give or take what rounding in another order adds
        theirs = python.net(tokens, shape.depth + CONTEXT, caches[1], shape.mask(torch.bfloat16))
        exact = reference.net(tokens, shape.depth + CONTEXT, caches[2],
                              shape.mask(torch.float32)).logits
        ours_error = (out.logits.float() - exact).abs().max()
        assert ours_error <= 2 * (theirs.logits.float() - exact).abs().max(), f"{q} nodes"


def test_loop_attention_prefill_writes_the_cache_decoding_writes(tmp_path):
    compiled, _ = int4_models(tmp_path, "llama-q4_1")
    cache = prefilled(compiled)
    tokens = torch.randint(0, 320, (CONTEXT,), generator=torch.Generator().manual_seed(0))
    one_by_one = StaticCache(compiled.config, CONTEXT + 40, compiled.dtype, "cpu")
    for i, token in enumerate(tokens.tolist()):
        compiled.net(torch.tensor([token]), torch.tensor([i]), one_by_one)
        one_by_one.commit(1)
    assert all(torch.equal(a[:, :CONTEXT], b[:, :CONTEXT])
               for a, b in zip(cache.k + cache.v, one_by_one.k + one_by_one.v))


def test_loop_attention_resume_equals_the_uninterrupted_run(tmp_path):
    # a resumed run prefills the tokens the interrupted one decoded: the same cache
    compiled, _ = int4_models(tmp_path, "llama-q4_1")
    kwargs = {"max_new_tokens": 40, "method": "ar", "seed": 3, "ignore_eos": True,
              "sampling": longspec.SamplingConfig(temperature=0.8, top_p=0.9)}
    ref = longspec.generate(compiled, list(range(3, 60)), **kwargs)
    assert compiled.net.attention == "loops"
    for k in (1, 17, 39):
        res = longspec.generate(compiled, list(range(3, 60)), resume_from=ref.token_ids[:k],
                                **kwargs)
        assert res.token_ids == ref.token_ids, k


def test_heads_not_of_a_multiple_of_16_take_the_products_in_python(tmp_path):
    make_checkpoint(tmp_path, "qwen3", hidden=192, intermediate=512, heads=6, kv_heads=2,
                    vocab=320)
    model = longspec.load_model(tmp_path, quantize="q4", device="cpu")
    assert model.config.head_dim == 24
    assert model.net.attention == "products" and model.net.native is None
    assert (model.profile.attention, model.profile.layers) == ("products", "python")


@pytest.mark.unit
def test_the_attention_operator_passes_opcheck():
    g = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(2, 300, 32, generator=g).bfloat16() for _ in range(2))
    shape = TreeShape([-1, 0, 0, 1], torch.device("cpu"))
    mask = shape.mask(torch.bfloat16)
    cases = [(torch.randn(1, 6, 32, generator=g).bfloat16(), 299, None, None),
             (torch.randn(4, 6, 32, generator=g).bfloat16(), 296, mask, block_order(mask))]
    for q, start, m, order in cases:
        library.opcheck(torch.ops.longspec.attention.default,
                        (q, keys, values, start, m, order, 32 ** -0.5),
                        test_utils=("test_schema", "test_faketensor",
                                    "test_autograd_registration"))


@pytest.mark.unit
@pytest.mark.parametrize("d", [32, 64, 128])   # the loops for any d, and those compiled for d
def test_the_attention_operator_is_attention(d):
    """Against float64 attention: a 5-node tree over 600 slots (three chunks), 3 query heads
    a key head (15 rows a head: the last four-row block runs past them)."""
    g = torch.Generator().manual_seed(0)
    n, start = 600, 595
    keys, values = (torch.randn(2, n, d, generator=g).bfloat16() for _ in range(2))
    q = torch.randn(5, 6, d, generator=g).bfloat16()
    parents = [-1, 0, 0, 1, 2]
    mask = TreeShape(parents, torch.device("cpu")).mask(torch.bfloat16)
    out = torch.ops.longspec.attention(q, keys, values, start, mask, block_order(mask),
                                       d ** -0.5)
    expected = torch.empty(5, 6, d, dtype=torch.float64)
    for t in range(5):
        ancestors = [t]
        while parents[ancestors[-1]] >= 0:
            ancestors.append(parents[ancestors[-1]])
        slots = list(range(start)) + [start + a for a in sorted(ancestors)]
        for h in range(6):
            k, v = keys[h // 3, slots].double(), values[h // 3, slots].double()
            p = torch.softmax(k @ q[t, h].double() * d ** -0.5, -1)
            expected[t, h] = p @ v
    torch.testing.assert_close(out.view(5, 6, d).double(), expected, atol=2e-3, rtol=1e-2)


@pytest.mark.unit
@pytest.mark.parametrize("d", [48, 64, 128])
@pytest.mark.parametrize("start", [299, 300])
@pytest.mark.parametrize("group", [3, 6])
def test_the_attention_operators_tree_rows_equal_their_paths_alone(d, start, group):
    """Each row of a tree is bitwise its path run alone as one query over the same keys, for a
    block that starts on an odd slot and an even one (the loops may sum keys two at a time), with
    3 and 6 query heads a key head (the loops sum a head's rows with the values in blocks of 3, 4
    or 6 rows)."""
    g = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 1, 2, 3, 3]
    keys, values = (torch.randn(2, start + len(parents), d, generator=g).bfloat16()
                    for _ in range(2))
    q = torch.randn(len(parents), 2 * group, d, generator=g).bfloat16()
    mask = TreeShape(parents, torch.device("cpu")).mask(torch.bfloat16)
    out = torch.ops.longspec.attention(q, keys, values, start, mask, block_order(mask),
                                       d ** -0.5)
    for t in range(len(parents)):
        path = [t]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        slots = list(range(start)) + [start + node for node in reversed(path)]
        alone = torch.ops.longspec.attention(q[t:t + 1], keys[:, slots], values[:, slots],
                                             len(slots) - 1, None, None, d ** -0.5)
        assert torch.equal(out[t], alone[0]), f"node {t} differs"


@pytest.mark.unit
@pytest.mark.parametrize("d, start", [(24, 9), (32, 10)])
def test_the_attention_operator_refuses_what_it_cannot_take(d, start):
    q = torch.zeros(1, 6, d, dtype=torch.bfloat16)
    keys = torch.zeros(2, 10, d, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="d a multiple of 16, heads a multiple of kv_heads "
                                           "and the block inside n"):
        torch.ops.longspec.attention(q, keys, keys, start, None, None, 1.0)
