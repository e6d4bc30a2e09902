"""The model's matrix products, batch-invariant: row i of a q-row product is bitwise the same
whatever q is and whatever the other rows hold, so a draft-tree node's logits equal those of
the same token run alone, and speculation writes exactly what plain decoding writes.

Measured on x86 CPUs with AVX-512 bfloat16, with and without AMX, and with AVX2 only (torch 2.13
and 2.15, oneDNN; docs/benchmarks/kernels.md), and checked on the host at every load (selfcheck.py):
- bfloat16 `F.linear` (oneDNN brgemm) is row-invariant from 2 to 32 rows. A 1-row product
  may take another path (without AMX above K = 1024; with AMX on torch 2.15 at any K): it
  runs as two rows. With AMX, products of more than 32 rows sum some rows otherwise (K of
  576 and up): they run in 32-row parts.
  PyTorch runs products of at most 16^3 multiply-adds (rows x K x N) in a plain loop that
  sums in another order (tiny layers): rows are added until a product passes that.
- float32 `x @ W` and `F.linear` are not (MKL picks kernels by row count: 1-3, 4, 8, >= 12);
  oneDNN's inner product (`mkldnn._linear_pointwise`) on weights kept as [in, out] is from 2
  rows on; 1 row takes another path (with AVX-512 above K = 1024, with AVX2 at some smaller K
  too): it runs as two rows (MIN_ROWS). It is also 2-2.5x faster than MKL for 8-16 rows.
- on AVX-512 without bfloat16 instructions (profile AVX512: oneDNN emulates bfloat16 products),
  bfloat16 `F.linear` sums rows otherwise from 4 rows on (13 at K = 1536), and the inner product
  is again row-invariant from 2 rows on: bfloat16 products take it there, as float32 ones do.
- the int4 weight-only kernel (`_weight_int4pack_mm_for_cpu`, bfloat16 activations) is
  row-invariant for 1..64 rows as it is; so is longspec::int4_mm (int4_mm.cpp), by
  construction (Int4Linear).
On CUDA (cuBLAS; measured on an H100 with torch 2.11, docs/benchmarks/cuda.md): a float32 product
of 1 row takes another kernel than one of 2 or more, float32 products of 80 rows or more sum rows
otherwise than one of 64, and so do bfloat16 ones of 128 rows or more at K = 8960 (a 1.5B
model's down projection). Every product runs as 64-row parts, fewer rows padded with zero rows to 64
(CUDA_ROWS): one shape, so one kernel, for a token alone, a draft tree's row and a prompt's.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from .compiled import cpu_isa, int4_mm, onednn_max_isa

MIN_ROWS = 2         # inner products of 1 row take another path in oneDNN: run as 2
ONEDNN_MIN_WORK = 16 ** 3   # bfloat16 products with rows * K * N at most this skip oneDNN
MAX_ROWS = 32        # bfloat16 products on AMX: more rows than this sum some rows otherwise
CUDA_ROWS = 64       # on CUDA every product runs as parts of exactly this many rows


def min_rows(k: int, n: int) -> int:
    """The fewest rows for which a [rows, k] x [k, n] bfloat16 product runs in oneDNN."""
    return ONEDNN_MIN_WORK // (k * n) + 1


def inner_products(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether dense products of this dtype run as oneDNN's inner product: float32 on a CPU,
    and bfloat16 on a CPU with AVX-512 but no bfloat16 instructions where oneDNN may use AVX-512
    (with less it has no bfloat16 inner product)."""
    limit = onednn_max_isa()
    onednn_avx512 = limit in ("ALL", "DEFAULT") or limit.startswith(("AVX512", "AVX10"))
    return device.type == "cpu" and (dtype == torch.float32 or (
        dtype == torch.bfloat16 and cpu_isa() == "AVX512" and onednn_avx512))


class DenseLinear(nn.Module):
    """y = x W^T + b with dense weights, batch-invariant on a CPU."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """weight [out, in]; kept as [in, out] for oneDNN's inner product (it reads it as is)."""
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.inner_product = inner_products(weight.dtype, weight.device)
        # on a CPU, fewer rows run padded with zero rows to this many (on CUDA, CUDA_ROWS)
        self.min_rows = (MIN_ROWS if self.inner_product
                         else max(2, min_rows(*weight.shape)))
        stored = weight.t().contiguous() if self.inner_product else weight
        self.weight = nn.Parameter(stored, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def dense_weight(self) -> torch.Tensor:
        """The weight as [out, in] (a view)."""
        return self.weight.t() if self.inner_product else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if x.device.type == "cpu":       # more rows than `most` run in parts, fewer than `least`
            most = rows if self.inner_product else MAX_ROWS     # padded with zero rows
            least = self.min_rows
        else:
            most = least = CUDA_ROWS
        if rows > most:
            return torch.cat([self(part) for part in x.split(most)])
        short = rows < least
        if short:
            x = torch.cat([x, x.new_zeros(least - rows, x.shape[1])])
        if self.inner_product:
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight.t(), self.bias, "none", [], "")
        else:
            y = F.linear(x, self.weight, self.bias)
        return y[:rows] if short else y


def joined_halves(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A matrix of two 4-bit halves (Q8_0, Q5_0, Q5_K) as one of 8-bit codes,
    q = 16 high + low - 128 with the low half's scale, where one half's scales are 16 times the
    other's (that half the high one) and the mins then add up exactly (every weight the same
    value); else None. Q5_0's and Q5_K's high halves hold 8 + their fifth bit, so their q are
    their 5-bit codes, 0..31."""
    k, g = codes.shape[1] // 2, scales.shape[1] // 2
    halves = [(codes[:, :k], scales[:, :g].float(), mins[:, :g].double()),
              (codes[:, k:], scales[:, g:].float(), mins[:, g:].double())]
    if torch.equal(halves[1][1], 16 * halves[0][1]):
        halves.reverse()
    (high, high_scale, high_min), (low, low_scale, low_min) = halves
    if not torch.equal(high_scale, 16 * low_scale):
        return None
    joined = high_min + 128 * low_scale.double() + low_min
    if not torch.equal(joined.float().double(), joined):
        return None
    return 16 * high + low - 128, low_scale, joined.float()


def pack_int4_mm(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int = 4
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands of longspec::int4_mm (int4_mm.cpp), in tiles of 16 outputs (`out` a multiple of
    16), per tile and group of 32 the codes of lane j = 0..7 (k = 4j..4j+3) as 64 bytes, output
    c's four at bytes 4c..4c+3: 4-bit codes [out, K'] -> uint8 [out, K' / 2] (lanes j and j + 4
    in one byte's low and high nibbles), 5-bit ones -> uint8 [out, 5K' / 8] (their low 4 bits so,
    then a block of 64 bytes of their high bits, lane j's at bit j), signed 8-bit ones -> int8
    [out, K']; scales and mins ->
    [out, K' / 32, 2], per tile and group the 16 scales then the 16 mins, in float16 where every
    one of them is a float16 value, else float32."""
    return _tile_codes(codes, bits), _tile_pairs(scales, mins)


def pack_int4_mm_16(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """longspec::int4_mm's operands for signed 8-bit codes [out, K] with a scale per 16 and no
    mins (Q6_K): the codes as pack_int4_mm's, the scales [out, K / 16] as pack_int4_mm's pairs
    (per tile and group of 32, the 16 scales of k 0..15 then those of k 16..31)."""
    out = codes.shape[0]
    return _tile_codes(codes, 8), _tile_pairs(scales[:, 0::2], scales[:, 1::2]).view(out, -1)


def pack_int4_mm_k(codes: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                   scale_codes: torch.Tensor, min_codes: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """longspec::int4_mm's operands for a K-quant matrix (Q4_K: W = d sc q - dmin m per group of
    32, d and dmin float16 per 256, sc and m 6-bit per group): the codes as pack_int4_mm's, and
    uint8 [out, K / 256, 20] holding, per tile of 16 outputs and superblock of 256, their 16 d
    and 16 -dmin as float16, then per group the 16 sc and the 16 m."""
    out, supers = d.shape
    tiles = out // 16

    group_codes = torch.stack([scale_codes.to(torch.uint8).view(tiles, 16, supers, 8),
                               min_codes.to(torch.uint8).view(tiles, 16, supers, 8)], 3)
    group_codes = group_codes.permute(0, 2, 4, 3, 1).reshape(tiles, supers, 256)
    scales = torch.cat([_tile_halves(d), _tile_halves(-dmin), group_codes], -1)
    return _tile_codes(codes, 4), scales.reshape(out, supers, 20).contiguous()


def pack_int4_mm_6(codes: torch.Tensor, d: torch.Tensor, scales: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """longspec::int4_mm's operands for Q6_K (W = d sc q per 16, q in -32..31, d float16 per 256,
    sc int8 per 16): uint8 [out, 3K / 4], per tile and group the nibbles of q + 32 as
    pack_int4_mm lays 4-bit codes, then two blocks of 64 bytes of their high 2 bits (lane j's in
    block j // 4 at bits 2 (j % 4)); int8 [out, K / 256, 18], per tile and superblock the 16
    d as float16, then per group the 16 sc of k 0..15 and the 16 of k 16..31."""
    out, k = codes.shape
    tiles, groups, supers = out // 16, k // 32, k // 256
    u = (codes.to(torch.int8) + 32).view(torch.uint8)       # in bytes: 0.11x the time of int32
    nibbles = _tile_codes(u & 15, 4).view(tiles, groups, 256)
    high = ((u >> 4) & 3).view(tiles, 16, groups, 2, 4, 4).permute(0, 2, 3, 4, 1, 5)
    high = (high[:, :, :, 0] | high[:, :, :, 1] << 2 | high[:, :, :, 2] << 4
            | high[:, :, :, 3] << 6).reshape(tiles, groups, 128)
    packed = torch.cat([nibbles, high], -1).reshape(out, 3 * k // 4)
    sc = scales.to(torch.int8).view(tiles, 16, supers, 8, 2).permute(0, 2, 3, 4, 1)
    block = torch.cat([_tile_halves(d), sc.reshape(tiles, supers, 256).view(torch.uint8)], -1)
    return packed.contiguous(), block.view(torch.int8).reshape(out, supers, 18).contiguous()


def _tile_halves(v: torch.Tensor) -> torch.Tensor:
    """[out, supers] float16 values -> [out / 16, supers, 32] bytes: per tile and superblock
    its 16 outputs' values."""
    out, supers = v.shape
    return (v.half().view(out // 16, 16, supers).transpose(1, 2).contiguous()
            .view(torch.uint8))


def _tile_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    out, k = codes.shape
    tiles, groups = out // 16, k // 32
    # as bytes first (the layout takes the codes' low 8 bits): 0.15-0.5x the time of int32 ones
    small = codes.to(torch.int8 if bits == 8 else torch.uint8)
    # [tile, group, lane j, output c, k within the lane]
    lanes = small.view(tiles, 16, groups, 8, 4).permute(0, 2, 3, 1, 4)
    if bits == 8:
        return lanes.reshape(out, k).contiguous()
    nibbles = lanes & 15
    nibbles = (nibbles[:, :, :4] | (nibbles[:, :, 4:] << 4)).reshape(tiles, groups, 256)
    if bits == 5:      # then a block of the high bits, lane j's at bit j
        bit = (lanes >> 4) & 1
        high = bit[:, :, 0]
        for j in range(1, 8):
            high = high | bit[:, :, j] << j
        nibbles = torch.cat([nibbles, high.reshape(tiles, groups, 64)], -1)
    return nibbles.reshape(out, k * bits // 8).contiguous()


def _tile_pairs(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[out, groups] twice -> [out, groups, 2] holding, per tile and group, the 16 `first` then
    the 16 `second`; float16 where all are float16 values, else float32."""
    out, groups = first.shape
    tiles = out // 16
    pairs = torch.stack([first.float().view(tiles, 16, groups),
                         second.float().view(tiles, 16, groups)], 1)   # [tile, 2, c, group]
    pairs = pairs.permute(0, 3, 1, 2).reshape(out, groups, 2)
    if torch.equal(pairs.half().float(), pairs):
        pairs = pairs.half()
    return pairs.contiguous()


class Int4Linear(nn.Module):
    """y = x W^T + b with W kept as packed 4-bit codes and per-32 scales and mins:
    W[n, k] = q[n, k] * scale + min. Formats with more bits (Q8_0, Q5_0, Q5_K) are two 4-bit
    halves along K, the activations given twice (`doubled`).

    On a CPU with AVX2 (AVX-512 and AMX included) it is longspec::int4_mm: the activations
    quantized to int8 per 32 as llama.cpp does, integer dot products per group on tiles of 16
    outputs, scales and mins exact, two halves joined into 5-bit codes (Q5_0, Q5_K) or 8-bit
    ones (Q8_0) where they can be (3-4x ATen's speed for one row, 2-3x for 16;
    docs/benchmarks/kernels.md), for matrices of a multiple of 16 outputs. Without the compiled
    kernels it is ATen's int4 kernel, W = (q - 8) * scale + zero with the scale and zero in
    bfloat16. Both are row-invariant."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                 doubled: bool, bias: torch.Tensor | None = None, group: int = 32,
                 factors: tuple[torch.Tensor, ...] | None = None):
        """codes int32 [out, K'] in 0..15; scales, mins float32 [out, K' / group]. Or, with
        group 16 and no mins, signed 8-bit codes [out, K] with a scale per 16 (Q6_K), which only
        longspec::int4_mm takes (`int4_mm()`, out a multiple of 16). `factors` (d, dmin, sc, m)
        of a K-quant (scales = d sc, mins = -dmin m), or (d, sc) of Q6_K (scales = d sc), let
        int4_mm read them as the file keeps them (same values, fewer bytes)."""
        super().__init__()
        self.group = group
        self.doubled = doubled
        self.out_features = codes.shape[0]
        # longspec::int4_mm takes tiles of 16 outputs
        self.int4_mm = group in (16, 32) and self.out_features % 16 == 0 and int4_mm()
        joined = joined_halves(codes, scales, mins) if self.int4_mm and doubled else None
        if mins is None:
            if not self.int4_mm:
                raise ValueError("scales per 16 without mins need longspec::int4_mm")
            packed, scale_zero = (pack_int4_mm_6(codes, *factors) if factors is not None
                                  else pack_int4_mm_16(codes, scales))
        elif joined is not None:      # one 5- or 8-bit group where there were two 4-bit ones
            self.doubled = False
            five = 0 <= int(joined[0].min()) and int(joined[0].max()) < 32
            packed, scale_zero = pack_int4_mm(*joined, bits=5 if five else 8)
        elif self.int4_mm and factors is not None and not doubled:
            packed, scale_zero = pack_int4_mm_k(codes, *factors)
        elif self.int4_mm:
            packed, scale_zero = pack_int4_mm(codes, scales, mins)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes.to(torch.int32).contiguous(), 1)
            # [K' / group, out, 2]: the scale and the zero (min + 8 scale) of each group
            zeros = mins.float() + 8 * scales.float()
            scale_zero = (torch.stack([scales.t(), zeros.t()], -1)
                          .to(torch.bfloat16).contiguous())
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zero", scale_zero)
        self.bias = None if bias is None else nn.Parameter(bias.to(torch.bfloat16),
                                                           requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Activations of any float dtype: the kernels are fast with bfloat16 ones (float32
        ones go through ATen's scalar loop ~270x slower), so they enter as bfloat16; the
        output comes in x's dtype. int4_mm rounds float32 ones to int8 as they are."""
        direct = self.int4_mm and x.dtype == torch.float32
        xin = x if x.dtype == torch.bfloat16 or direct else x.to(torch.bfloat16)
        if self.int4_mm:
            y = torch.ops.longspec.int4_mm(xin, self.packed, self.scale_zero)
        else:
            if self.doubled:
                xin = torch.cat([xin, xin], -1)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xin.contiguous(), self.packed,
                                                           self.group, self.scale_zero)
        if self.bias is not None:
            y = y + self.bias
        # a no-op cast still costs a framework call (~2 us); a step makes ~120 of these
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)


class RowParts(nn.Module):
    """One product whose rows come in parts of different kernel formats (a fused q|k|v whose v
    is quantized otherwise than q and k): each part's product, the outputs side by side. Every
    output is its part's, so the product is as row-invariant as its parts."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], -1)


class HeadPart:
    """An LM head's logits over part of the vocabulary, the others -inf: its first `first`
    tokens, and from `add` on every block of 16 tokens (a tile of int4_mm's layout) holding a
    token it was given, the blocks' weights copied from the head's as they come (a draft
    model's head over a draft vocabulary: chain.py). `over` gives None where the head's layout
    keeps no such blocks."""

    BLOCK = 16
    ROOM = 256      # blocks the store has room for past those it holds, at least

    @classmethod
    def over(cls, head: nn.Module, first: int) -> HeadPart | None:
        if not (isinstance(head, Int4Linear) and head.int4_mm):
            return None
        return cls(head, first)

    def __init__(self, head: Int4Linear, first: int):
        self.head = head
        self.vocab = head.out_features
        blocks = self.vocab // self.BLOCK
        # the head's tensors with a row per output, a block's rows as one row
        tensors = {**head._buffers, **head._parameters}
        self.sources = {name: t.view(blocks, -1) for name, t in tensors.items() if t is not None}
        self.store = {name: t.new_empty(0, t.shape[1]) for name, t in self.sources.items()}
        self.blocks: list[int] = []
        self.known: set[int] = set()
        self.part = copy.copy(head)     # the head's product over the stored blocks
        self._add(list(range(first // self.BLOCK)))

    def add(self, tokens) -> None:
        """Give the blocks of `tokens` their logits from now on."""
        self._add(sorted({t // self.BLOCK for t in tokens} - self.known))

    def _add(self, blocks: list[int]) -> None:
        if not blocks:
            return
        count = len(self.blocks) + len(blocks)
        device = self.head.packed.device
        index = torch.tensor(blocks, device=device)
        for name, source in self.sources.items():
            store = self.store[name]
            if store.shape[0] < count:     # with room for a quarter more (some 256 blocks)
                room = count + max(self.ROOM, count // 4)
                grown = store.new_empty(min(room, source.shape[0]), store.shape[1])
                grown[:len(self.blocks)] = store[:len(self.blocks)]
                store = self.store[name] = grown
            store[len(self.blocks):count] = source[index]
        self.blocks += blocks
        self.known.update(blocks)
        n = count * self.BLOCK
        self.part._buffers = {name: self.store[name][:count].view(n, *b.shape[1:])
                              for name, b in self.head._buffers.items()}
        self.part._parameters = {
            name: None if p is None else
            nn.Parameter(self.store[name][:count].view(n), requires_grad=False)
            for name, p in self.head._parameters.items()}
        self.part.out_features = n
        first = torch.tensor(self.blocks, device=device) * self.BLOCK
        self.ids = (first[:, None] + torch.arange(self.BLOCK, device=device)).view(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        part = self.part(x)
        return part.new_full((x.shape[0], self.vocab), float("-inf")).index_copy_(1, self.ids,
                                                                                    part)
