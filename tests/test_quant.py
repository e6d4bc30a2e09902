"""Quantized weights kept quantized: GGUF blocks on an int4 kernel (longspec::int4_mm, or
PyTorch's without the compiled kernels).

- the kernel operands reproduce GGUF's dequantization exactly (run in float32);
- the fast (bfloat16) kernels' weights stay within bfloat16 rounding of GGUF's values;
- rows of a product do not depend on how many rows share it;
- a quantized model's logits stay within the error transformers itself makes running the same
  dequantized weights in bfloat16, and every method writes exactly what `ar` writes.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_writer import K_QUANTS, encode, reference, write_gguf
from helpers import assert_matches_ar, make_checkpoint, opcheck_int4_mm, our_logits

import longspec
from longspec.models.compiled import int4_mm
from longspec.models.linear import Int4Linear, RowParts, joined_halves
from longspec.models.quant import (
    Blocks,
    k_factors,
    kernel_operands,
    q6_factors,
    quantize_dense,
    sixteen_operands,
)

pytestmark = pytest.mark.profiles
KERNEL = torch.ops.aten._weight_int4pack_mm_for_cpu
N, K = 64, 512


def gguf_matrix(qtype: str, seed: int = 0) -> Blocks:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.05
    if qtype in K_QUANTS:
        raw = encode(w, qtype, rng)[0]
    else:
        raw = quantize(w, GGMLQuantizationType[qtype])
    return Blocks(qtype, raw, (N, K))


def kernel_weights(blocks: Blocks, dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weights the kernel multiplies with: one-hot rows through it."""
    codes, scales, mins, doubled = kernel_operands(blocks)
    codes, scales, mins = (torch.from_numpy(a) for a in (codes, scales, mins))
    zeros = mins + 8 * scales           # the kernel's form, (q - 8) * scale + zero
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    sz = torch.stack([scales.t(), zeros.t()], -1).to(dtype).contiguous()
    eye = torch.eye(K, dtype=dtype)
    x = torch.cat([eye, eye], -1) if doubled else eye
    return KERNEL(x, packed, 32, sz).float().t()


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K"])
def test_kernel_operands_reproduce_gguf_dequantization_exactly(qtype):
    blocks = gguf_matrix(qtype)
    gguf_values = torch.from_numpy(dequantize(blocks.raw, GGMLQuantizationType[qtype]))
    assert torch.equal(kernel_weights(blocks, torch.float32), gguf_values.reshape(N, K))


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K"])
def test_bfloat16_kernel_weights_are_within_bfloat16_rounding_of_gguf(qtype):
    blocks = gguf_matrix(qtype)
    gguf_values = torch.from_numpy(dequantize(blocks.raw, GGMLQuantizationType[qtype]))
    fast = kernel_weights(blocks, torch.bfloat16)
    # the kernel rounds each group's scale and zero to bfloat16 (relative error 2^-9 each),
    # then computes (q - 8) * scale + zero in float32 and rounds the product once to bfloat16
    _, scales, mins, _ = kernel_operands(blocks)
    bound = ((8 * np.abs(scales) + np.abs(mins + 8 * scales)).max()
             + gguf_values.abs().max()) * 2.0 ** -8
    assert (fast - gguf_values.reshape(N, K)).abs().max() <= bound


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K"])
def test_int4_layer_weights_are_within_bfloat16_rounding_of_gguf(qtype):
    """The weights Int4Linear multiplies with (exact scales and mins, the output rounded to
    bfloat16), read back through one-hot rows."""
    blocks = gguf_matrix(qtype)
    gguf_values = torch.from_numpy(dequantize(blocks.raw, GGMLQuantizationType[qtype]))
    codes, scales, mins, doubled = kernel_operands(blocks)
    layer = Int4Linear(*(torch.from_numpy(a) for a in (codes, scales, mins)), doubled)
    ours = layer(torch.eye(K, dtype=torch.bfloat16)).float().t()
    bound = ((16 * np.abs(scales) + np.abs(mins)).max() + gguf_values.abs().max()) * 2.0 ** -8
    assert (ours - gguf_values.reshape(N, K)).abs().max() <= bound


@pytest.mark.unit
def test_q6_k_codes_and_scales_per_16_reproduce_gguf_dequantization_exactly():
    blocks = gguf_matrix("Q6_K")
    gguf_values = dequantize(blocks.raw, GGMLQuantizationType.Q6_K).reshape(N, K)
    codes, scales = sixteen_operands(blocks)
    assert codes.min() >= -32 and codes.max() <= 31
    assert np.array_equal((codes.reshape(N, -1, 16) * scales[..., None]).reshape(N, K),
                          gguf_values)


@pytest.mark.unit
@pytest.mark.compiled("int4_mm")      # Q6_K stays quantized only on longspec::int4_mm
def test_q6_k_layer_weights_are_within_bfloat16_rounding_of_gguf():
    """A Q6_K matrix kept as 8-bit codes with its scales per 16, read back through one-hot
    rows (each one exact in int8: code 127, step 1 / 127)."""
    blocks = gguf_matrix("Q6_K")
    gguf_values = torch.from_numpy(dequantize(blocks.raw, GGMLQuantizationType.Q6_K))
    codes, scales = (torch.from_numpy(a) for a in sixteen_operands(blocks))
    layer = Int4Linear(codes, scales, None, False, group=16)
    ours = layer(torch.eye(K, dtype=torch.bfloat16)).float().t()
    assert (ours - gguf_values.reshape(N, K)).abs().max() <= gguf_values.abs().max() * 2.0 ** -8


def as_the_file_keeps_it(qtype: str) -> tuple[Int4Linear, Int4Linear]:
    """(the layer from float32 scales, the layer from the file's own scale codes) of a Q4_K
    (scales d sc and mins -dmin m) or Q6_K (scales d sc per 16) matrix."""
    blocks = gguf_matrix(qtype)
    if qtype == "Q4_K":
        codes, scales, mins = (torch.from_numpy(a) for a in kernel_operands(blocks)[:3])
        factors = tuple(torch.from_numpy(a) for a in k_factors(blocks))
        return (Int4Linear(codes, scales, mins, False),
                Int4Linear(codes, scales, mins, False, factors=factors))
    codes, scales = (torch.from_numpy(a) for a in sixteen_operands(blocks))
    factors = tuple(torch.from_numpy(a) for a in q6_factors(blocks))
    return (Int4Linear(codes, scales, None, False, group=16),
            Int4Linear(codes, scales, None, False, group=16, factors=factors))


@pytest.mark.unit
@pytest.mark.compiled("int4_mm")      # K-quants as the file keeps them: int4_mm only
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quants_as_the_file_keeps_them_give_the_same_bits_in_fewer_bytes(qtype):
    """int4_mm reads Q4_K's float16 d and dmin per 256 with 6-bit codes per 32, and Q6_K's
    6-bit weights with int8 scales per 16 and float16 d per 256, multiplying the scales out
    exactly: the same outputs as from float32 scales (and, for Q6_K, 8-bit codes)."""
    plain, compact = as_the_file_keeps_it(qtype)
    assert compact.scale_zero.nbytes * 3 < plain.scale_zero.nbytes
    if qtype == "Q6_K":
        assert compact.packed.nbytes * 4 == plain.packed.nbytes * 3
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(7, K, generator=g) * 3).to(dtype)
        assert torch.equal(compact(x), plain(x))
    opcheck_int4_mm(x, compact.packed, compact.scale_zero)


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0", "Q5_K"])
def test_two_halves_join_into_codes_of_the_same_values_5_bits_for_q5(qtype):
    codes, scales, mins, doubled = (torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                                    for a in kernel_operands(gguf_matrix(qtype)))
    q, scale, low = joined_halves(codes, scales, mins)
    assert doubled and q.min() >= -128 and q.max() <= 127
    five = qtype != "Q8_0"
    assert (q.min() >= 0 and q.max() <= 31) == five
    if int4_mm():       # the layer reads 5 bits a weight (8 for Q8_0) in int4_mm's layout
        layer = Int4Linear(codes, scales, mins, doubled)
        assert layer.packed.shape == (N, K * (5 if five else 8) // 8)

    def weights(c, s, m):
        return (c.double() * s.double().repeat_interleave(32, 1)
                + m.double().repeat_interleave(32, 1))

    halves = weights(codes, scales, mins)
    assert torch.equal(weights(q, scale, low), halves[:, :K] + halves[:, K:])
    other = scales.clone()
    other[:, :other.shape[1] // 2] *= 2                        # halves of other scales stay so
    assert joined_halves(codes, other, mins) is None


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_rows_of_the_int4_kernel_do_not_depend_on_the_row_count(qtype):
    blocks = gguf_matrix(qtype)
    codes, scales, mins, doubled = kernel_operands(blocks)
    layer = Int4Linear(*(torch.from_numpy(a) for a in (codes, scales, mins)), doubled)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, K, generator=g) * torch.rand(64, 1, generator=g) * 4).bfloat16()
    alone = torch.cat([layer(x[i:i + 1]) for i in range(64)])
    for rows in (2, 3, 5, 8, 16, 33, 64):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


def test_quantized_gguf_stays_quantized_and_matches_transformers_within_bfloat16_error(tmp_path):
    hf = make_checkpoint(tmp_path / "hf", "llama", hidden=128, intermediate=256, vocab=320)
    ref = reference(hf, write_gguf(hf, tmp_path / "m.gguf", "Q4_1"))
    model = longspec.load_model(tmp_path / "m.gguf", device="cpu")
    assert model.weight_format == "int4" and model.dtype == torch.bfloat16
    ids = torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = ref(ids[None]).logits[0]
        theirs_bf16 = ref.to(torch.bfloat16)(ids[None]).logits[0].float()
    ref.float()
    ours = our_logits(model, ids).float()
    # tolerance: what transformers itself loses running the same weights in bfloat16, times 3
    # (our kernel also rounds each group's scale and zero to bfloat16)
    assert (ours - exact).abs().max() <= 3 * (theirs_bf16 - exact).abs().max()


# llama.cpp's Q4_K_M mix on a model shaped as SmolLM2 is: heads of 64 in groups of 3 (GQA), the
# embedding tied to the head in Q8_0, Q6_K beside Q4_K
MIX = {"default": "Q4_K", "ffn_down": "Q6_K", "attn_v": "Q6_K", "token_embd": "Q8_0"}
S = longspec.SamplingConfig
SETTINGS = {"greedy": S(temperature=0), "greedy_penalty": S(temperature=0, penalty=1.2),
            "sampled": S(temperature=0.8), "sampled_penalty": S(temperature=1.0, min_p=0.1,
                                                                penalty=1.2, penalty_window=32)}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("q4_k_m")
    hf = make_checkpoint(path / "hf", "llama", hidden=768, intermediate=512, heads=12,
                         kv_heads=4, vocab=320, tied=True, max_positions=256)
    write_gguf(hf, path / "m.gguf", MIX)
    model = longspec.load_model(path / "m.gguf", device="cpu")
    assert model.weight_format == "int4" and model.config.tie_word_embeddings
    # Q6_K (ffn_down) kept as 8-bit codes where longspec::int4_mm runs, else dense
    down = model.net.layers[0].w_down
    assert isinstance(down, Int4Linear) == int4_mm()
    # q|k in Q4_K beside v in Q6_K: one product of two quantized parts there, else dense
    assert isinstance(model.net.layers[0].wqkv, RowParts) == int4_mm()
    return model


@pytest.mark.parametrize("method", ["auto", "pld", "recycling", "suffix"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_every_method_matches_ar_on_a_quantized_gguf(mixed_gguf, method, setting):
    """The equality matrix on the path users run: a GGUF kept quantized (Q4_K with Q6_K and a
    tied Q8_0 head), through the compiled layers where a compiler is."""
    res = assert_matches_ar(mixed_gguf, [5, 6, 7, 8, 5, 6, 7, 8, 9], method, 48,
                            sampling=SETTINGS[setting], seed=2, options={"sizing": "fixed"})
    assert res.stats["weights"] == "int4"


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_quantize_a_dense_checkpoint(tmp_path, kind):
    make_checkpoint(tmp_path, "qwen2", hidden=128, intermediate=256, vocab=320)
    dense = longspec.load_model(tmp_path, dtype="bfloat16", device="cpu")
    quant = longspec.load_model(tmp_path, device="cpu", quantize=kind)
    assert quant.weight_format == "int4"
    ids = torch.randint(0, 320, (24,), generator=torch.Generator().manual_seed(3))
    a, b = our_logits(dense, ids).float(), our_logits(quant, ids).float()
    # weights: 4 bits per value in groups of 32 keep a Gaussian matrix within ~8% (relative
    # RMS), 8 bits within ~0.5%; random tiny models amplify that in the logits (bfloat16 alone
    # moves them 2.1% from float32 here; q8 on ATen's kernel 4.2%, on int4_mm's int8
    # activations 5.3%)
    assert (a - b).norm() / a.norm() < (0.6 if kind == "q4" else 0.07)
    w = dense.net.layers[0].w_down.dense_weight.float()
    codes, scales, mins, doubled = (torch.as_tensor(v) for v in quantize_dense(w, kind))
    back = codes.float() * scales.repeat_interleave(32, 1) + mins.repeat_interleave(32, 1)
    if doubled:
        back = back[:, :w.shape[1]] + back[:, w.shape[1]:]
    assert (back - w).norm() / w.norm() < (0.1 if kind == "q4" else 0.01)


def test_quantize_refuses_what_it_cannot_do(tmp_path):
    make_checkpoint(tmp_path, "llama")
    with pytest.raises(ValueError, match="quantize must be one of q4, q8"):
        longspec.load_model(tmp_path, quantize="q3")
    hf = make_checkpoint(tmp_path / "hf", "llama")
    write_gguf(hf, tmp_path / "m.gguf", "Q4_0")
    with pytest.raises(ValueError, match="quantized already"):
        longspec.load_model(tmp_path / "m.gguf", quantize="q4")
