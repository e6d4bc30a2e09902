"""longspec::int4_mm (models/int4_mm.cpp), the int4 product of CPUs with AVX2 or AVX-512: a
registered operator whose rows do not depend on how many there are, within int8 activation
rounding of the exact product, for 4-bit matrices and doubled ones (two halves), 8-bit ones
with scales per 32 or per 16 (Q6_K's form), float16 and float32 scales, with the same bits on
every CPU it builds for. The K-quant formats (Q4_K's and Q6_K's scales as the file keeps them)
are tested against these in test_quant.py."""

import hashlib

import numpy as np
import pytest
import torch
from helpers import opcheck_int4_mm

from longspec.models.linear import pack_int4_mm, pack_int4_mm_16

pytestmark = [pytest.mark.unit, pytest.mark.compiled("int4_mm"), pytest.mark.profiles]


def plain_operands(out: int, k: int, doubled: bool, half_scales: bool, bits: int = 4,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(codes [out, k'], scales, mins [out, k' / 32]) of a random matrix of 4-bit codes (two
    halves of them, k' = 2k, when `doubled`), 5-bit ones or signed 8-bit ones; `bits` 6: Q6_K's
    form, signed codes with scales [out, k / 16] and no mins."""
    g = torch.Generator().manual_seed(seed)
    if bits == 6:
        codes = torch.randint(-32, 32, (out, k), generator=g)
        scales = torch.rand(out, k // 16, generator=g) * 0.02
        return codes, scales.half().float() if half_scales else scales, None
    width = 2 * k if doubled else k
    codes = (torch.randint(0, 2 ** bits, (out, width), generator=g) if bits in (4, 5)
             else torch.randint(-128, 128, (out, width), generator=g))
    scales = torch.rand(out, width // 32, generator=g) * 0.02
    mins = -torch.rand(out, width // 32, generator=g) * 0.1
    if half_scales:
        scales, mins = scales.half().float(), mins.half().float()
    return codes, scales, mins


def operands(out: int, k: int, doubled: bool, half_scales: bool, bits: int = 4, seed: int = 0):
    """(codes, scale_min, W [out, k] float64): plain_operands packed for longspec::int4_mm, and
    the weights they stand for."""
    codes, scales, mins = plain_operands(out, k, doubled, half_scales, bits, seed)
    if mins is None:
        packed, scale_min = pack_int4_mm_16(codes, scales)
        w = (codes.double().view(out, -1, 16) * scales.double()[..., None]).view(out, k)
    else:
        packed, scale_min = pack_int4_mm(codes, scales, mins, bits)
        w = (codes.double().view(out, -1, 32) * scales.double()[..., None]
             + mins.double()[..., None]).view(out, -1)
        if doubled:
            w = w[:, :k] + w[:, k:]
    assert scale_min.dtype == (torch.float16 if half_scales else torch.float32)
    return packed, scale_min, w


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c of float32 values with one rounding to float32, as a fused multiply-add makes
    it: a * b is exact in float64, their sum with c is rounded to odd there (TwoSum gives its
    error exactly), and a sum rounded to odd with 29 bits to spare rounds to float32 as the
    exact one does."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64)
    s = p + c
    back = s - p
    error = (p - (s - back)) + (c - back)
    inexact = error != 0
    s = np.where(inexact & (np.signbit(error) != np.signbit(s)), np.nextafter(s, 0), s)
    return (s.view(np.int64) | inexact).view(np.float64).astype(np.float32)


def int4_mm_definition(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                       mins: torch.Tensor | None) -> torch.Tensor:
    """longspec::int4_mm as int4_mm.cpp's header defines it, on plain_operands: each row's
    activations per group of 32 as int8 codes qx (step d = max |x| / 127, qx = x * (1 / d)
    rounded half to even); per group the exact integer dot product of the codes with qx, then
    acc = fma(dot, scale * d, acc) and offset = fma(min, d * sum(qx), offset) (scales per 16:
    acc takes each half's dot and scale in turn); the output acc + offset, in x's dtype."""
    rows, k = x.shape
    groups = k // 32
    x32 = x.float().numpy().reshape(rows, groups, 32)
    step = np.abs(x32).max(-1) / np.float32(127)
    inverse = np.divide(np.float32(1), step, out=np.zeros_like(step), where=step > 0)
    qx = np.rint(x32 * inverse[..., None]).astype(np.int64)
    total = step * qx.sum(-1).astype(np.float32)
    q = codes.numpy().astype(np.int64)
    sixteen = mins is None
    scale = scales.float().numpy().reshape(len(q), -1, 2 if sixteen else 1)
    acc = offset = np.zeros((rows, len(q)), np.float32)
    for g in range(q.shape[1] // 32):
        gx = g % groups                # two halves: the second takes the first's activations
        w = q[:, 32 * g:32 * g + 32]
        steps = step[:, gx, None]
        if sixteen:
            for h in (0, 1):
                dot = qx[:, gx, 16 * h:16 * h + 16] @ w[:, 16 * h:16 * h + 16].T
                acc = fma32(dot.astype(np.float32), scale[None, :, g, h] * steps, acc)
        else:
            dot = qx[:, gx] @ w.T
            acc = fma32(dot.astype(np.float32), scale[None, :, g, 0] * steps, acc)
            offset = fma32(np.broadcast_to(mins.numpy()[None, :, g], acc.shape),
                           np.broadcast_to(total[:, gx, None], acc.shape), offset)
    return torch.from_numpy(acc + offset).to(x.dtype)


# (out, k, doubled, float16 scales, bits)
CASES = [(96, 128, False, True, 4), (64, 192, True, True, 4), (160, 64, False, False, 4),
         (32, 96, True, False, 4), (48, 128, False, True, 8), (64, 192, False, False, 8),
         (64, 256, False, True, 6), (48, 96, False, False, 6), (64, 192, False, True, 5),
         (48, 96, False, False, 5)]


# matrices of one tile and odd numbers of groups (1, 3, 5, the halves' 10): no tile or group
# count a multiple of two, nor of the 8 groups the kernel prefetches ahead
TAILS = [(16, 32, False, True, 4), (16, 160, True, False, 4), (48, 96, False, True, 4),
         (16, 32, False, False, 8), (16, 160, False, True, 5), (16, 32, False, True, 6),
         (32, 160, False, False, 6)]


@pytest.mark.parametrize("out,k,doubled,half_scales,bits", CASES + TAILS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_product_is_bitwise_its_definition(out, k, doubled, half_scales, bits, dtype):
    """Against int4_mm_definition, for 1 and 2 rows and 15 (a block of 8, one of 4 and one of
    3: every block size the kernel runs), rows of values far apart in size."""
    codes, scales, mins = plain_operands(out, k, doubled, half_scales, bits)
    packed, scale_min, _ = operands(out, k, doubled, half_scales, bits)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(15, k, generator=g) * 4.0 ** torch.arange(-7, 8)[:, None]).to(dtype)
    for rows in (x[:1], x[7:9], x):
        expected = int4_mm_definition(rows, codes, scales, mins)
        assert torch.equal(torch.ops.longspec.int4_mm(rows, packed, scale_min), expected), \
            len(rows)


@pytest.mark.parametrize("out,k,doubled,half_scales,bits", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_product_is_within_int8_rounding_of_the_exact_one(out, k, doubled, half_scales, bits,
                                                          dtype):
    packed, scale_min, w = operands(out, k, doubled, half_scales, bits)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = torch.ops.longspec.int4_mm(x, packed, scale_min)
    assert y.dtype == dtype and y.shape == (5, out)
    exact = x.double() @ w.t()
    # int8 activations: each group's error at most half a step (max |x| / 254) per weight
    bound = (x.double().abs().amax(1, keepdim=True) / 254) * w.abs().sum(1) + 1e-3
    rounding = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
    assert ((y.double() - exact).abs() <= bound + rounding * exact.abs()).all()


@pytest.mark.parametrize("out,k,doubled,half_scales,bits", CASES)
def test_rows_do_not_depend_on_the_row_count_or_the_other_rows(out, k, doubled, half_scales,
                                                               bits):
    packed, scale_min, _ = operands(out, k, doubled, half_scales, bits)
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(40, k, generator=g) * torch.rand(40, 1, generator=g) * 4).bfloat16()
    alone = torch.cat([torch.ops.longspec.int4_mm(x[i:i + 1], packed, scale_min)
                       for i in range(40)])
    for rows in (2, 3, 4, 5, 6, 7, 8, 13, 15, 21, 40):     # every block of rows the kernel has
        assert torch.equal(torch.ops.longspec.int4_mm(x[:rows], packed, scale_min),
                           alone[:rows]), rows
    other = x.clone()
    other[1:] = torch.randn(39, k, generator=g).bfloat16()
    assert torch.equal(torch.ops.longspec.int4_mm(other, packed, scale_min)[0], alone[0])


def test_threads_do_not_change_the_bits():
    packed, scale_min, _ = operands(256, 128, False, True)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(3)).bfloat16()
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):        # one thread, and the output columns split between two
            torch.set_num_threads(n)
            outs.append(torch.ops.longspec.int4_mm(x, packed, scale_min))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*outs)


def test_the_operator_passes_opcheck():
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4)).bfloat16()
    for bits in (4, 8, 6):
        packed, scale_min, _ = operands(64, 128, bits == 4, True, bits)
        opcheck_int4_mm(x, packed, scale_min)


def test_operands_of_the_wrong_shape_are_refused():
    packed, scale_min, _ = operands(64, 128, False, True)
    with pytest.raises(RuntimeError, match="k a multiple of 32"):
        torch.ops.longspec.int4_mm(torch.zeros(2, 100, dtype=torch.bfloat16), packed, scale_min)
    with pytest.raises(RuntimeError, match="of no format it takes"):
        torch.ops.longspec.int4_mm(torch.zeros(2, 96, dtype=torch.bfloat16), packed, scale_min)
    with pytest.raises(RuntimeError, match="k a multiple of 32 and n a multiple of 16"):
        torch.ops.longspec.int4_mm(torch.zeros(2, 128, dtype=torch.bfloat16), packed[:40],
                                   scale_min[:40])
    with pytest.raises(RuntimeError, match="float16 or float32 scales"):
        torch.ops.longspec.int4_mm(torch.zeros(2, 128, dtype=torch.bfloat16), packed,
                                   scale_min.bfloat16())


# sha256 (first 16 hex digits) of the float32 outputs of each case below, on a CPU with AVX-512
# VNNI; every build (AVX2 ones, and under every kernel profile CI emulates) must give these bits
GOLDEN = {(4, True, False, torch.float32): "b779cd4908932994",
          (4, True, False, torch.bfloat16): "8c2c452eca8579ec",
          (4, False, True, torch.float32): "db22f7b1d5155eb0",
          (8, True, False, torch.float32): "fed3506d3f46913d",
          (8, False, False, torch.bfloat16): "66283bfd61bd0d9a",
          (6, True, False, torch.float32): "05b9c9a223e9eba7",
          (6, False, False, torch.bfloat16): "377866347207424c",
          (5, True, False, torch.float32): "06c40ea3d55bbb35",
          (5, False, False, torch.bfloat16): "cb3bfb5f77b119e4"}


@pytest.mark.parametrize("bits,half_scales,doubled,dtype", list(GOLDEN))
def test_the_bits_are_the_same_on_every_cpu(bits, half_scales, doubled, dtype):
    """Operands made by integer arithmetic (no random generator, whose vector paths differ
    between CPUs), 7 rows (a block of 4 and one of 3), a tile of 16 outputs and one over."""
    out, k = 32, 96
    width = 2 * k if doubled else k
    i = torch.arange(out * width).view(out, width)
    codes = ((i * 7 + i // width * 3) % 2 ** bits if bits in (4, 5)
             else (i * 37 + i // width * 11) % 256 - 128)
    g = torch.arange(out * width // (16 if bits == 6 else 32)).view(out, -1)
    scales = ((g * 13) % 29 + 1).float() / (1024 if half_scales else 1000)
    mins = -((g * 5) % 17).float() / (256 if half_scales else 300)
    packed, scale_min = (pack_int4_mm_16(codes // 4, scales) if bits == 6
                         else pack_int4_mm(codes, scales, mins, bits))
    assert scale_min.dtype == (torch.float16 if half_scales else torch.float32)
    x = (((torch.arange(7 * k).view(7, k) * 7919) % 2001 - 1000).float() / 97).to(dtype)
    y = torch.ops.longspec.int4_mm(x, packed, scale_min).float()
    digest = hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16]
    assert digest == GOLDEN[bits, half_scales, doubled, dtype]
