"""Weights kept quantized: GGUF blocks mapped onto the int4 kernels (linear.py's Int4Linear), and
group-wise quantization of dense checkpoints (`--quantize q4|q8`).

The kernels take W[n, k] = q * scale + min per group of 32 along K, with 4-bit codes q. GGUF's
formats map onto it exactly (every value in float32 equals `gguf.quants.dequantize`'s):

| GGUF | q                        | scale          | min                        | K   |
|------|--------------------------|----------------|----------------------------|-----|
| Q4_0 | nibble                   | d              | -8d                        | K   |
| Q4_1 | nibble                   | d              | m                          | K   |
| Q4_K | nibble                   | d sc_j         | -dmin mn_j                 | K   |
| Q8_0 | [q8 >> 4 + 8, q8 & 15]   | [16d, d]       | [-128d, 0]                 | 2K  |
| Q5_0 | [low nibble, high bit+8] | [d, 16d]       | [-16d, -128d]              | 2K  |
| Q5_K | [low nibble, high bit+8] | [d sc, 16 d sc]| [-dmin mn, -128 d sc]      | 2K  |

(2K: two 4-bit halves along K, the activations given twice.) Q6_K has a scale per 16 weights,
finer than those groups: longspec::int4_mm takes it as signed codes q - 32 with the scales d sc
per 16 and no mins (`sixteen_operands`), kept as 6 bits with d and sc apart (`q6_factors`); the
other kernels take it dense. int4_mm also takes Q4_K's d, dmin, sc and mn apart (`k_factors`).
How each kernel rounds the scales and mins is Int4Linear's to say (tests and
docs/benchmarks/kernels.md give the bounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32
KERNEL_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q5_0", "Q5_K")
SIXTEEN_TYPES = ("Q6_K",)     # longspec::int4_mm's scales per 16
DOUBLED = ("Q8_0", "Q5_0", "Q5_K")
QUANTIZE = ("q4", "q8")


@dataclass(frozen=True)
class Blocks:
    """One matrix as GGUF stores it: rows of quantized blocks along K."""

    qtype: str
    raw: np.ndarray        # uint8 [out, bytes per row]
    shape: tuple[int, int]  # (out, in)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [..., 16] -> [..., 32]: the low nibbles are elements 0..15, the high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a K-quant superblock, from its 12 bytes."""
    s = packed.reshape(*packed.shape[:-1], 3, 4)
    a, b, c = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def kernel_operands(blocks: Blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(codes int32 [out, K'], scales, mins float32 [out, K' / 32], doubled) of a GGUF matrix."""
    n, k = blocks.shape
    raw = blocks.raw
    if blocks.qtype == "Q4_0":
        b = raw.reshape(n, k // 32, 18)
        d = _f16(b[..., 0:2])
        return _nibbles(b[..., 2:18]).reshape(n, k), d, -8 * d, False
    if blocks.qtype == "Q4_1":
        b = raw.reshape(n, k // 32, 20)
        return _nibbles(b[..., 4:20]).reshape(n, k), _f16(b[..., 0:2]), _f16(b[..., 2:4]), False
    if blocks.qtype == "Q8_0":
        b = raw.reshape(n, k // 32, 34)
        d = _f16(b[..., 0:2])
        q8 = np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int32).reshape(n, k)
        return _halves(q8, d)
    if blocks.qtype == "Q5_0":
        b = raw.reshape(n, k // 32, 22)
        d = _f16(b[..., 0:2])
        bits = np.ascontiguousarray(b[..., 2:6]).view("<u4")          # bit j -> element j
        high = (bits >> np.arange(32, dtype=np.uint32)) & 1
        return (np.concatenate([_nibbles(b[..., 6:22]).reshape(n, k),
                                high.reshape(n, k).astype(np.int32) + 8], 1),
                np.concatenate([d, 16 * d], 1), np.concatenate([-16 * d, -128 * d], 1), True)
    if blocks.qtype in ("Q4_K", "Q5_K"):
        size = 144 if blocks.qtype == "Q4_K" else 176
        b = raw.reshape(n, k // 256, size)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        scale = (d[..., None] * sc).reshape(n, k // 32)
        low_min = (-dmin[..., None] * mn).reshape(n, k // 32)
        qs = b[..., size - 128:].reshape(n, k // 256, 4, 32)     # chunk c: sub-blocks 2c, 2c+1
        low = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)
        if blocks.qtype == "Q4_K":
            return low, scale, low_min, False
        bits = (b[..., 16:48][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
        high = bits.reshape(n, k).astype(np.int32) + 8            # bit j -> sub-block j
        return (np.concatenate([low, high], 1), np.concatenate([scale, 16 * scale], 1),
                np.concatenate([low_min, -128 * scale], 1), True)
    raise ValueError(f"no int4 kernel mapping for {blocks.qtype}")


def k_factors(blocks: Blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, dmin float32 [out, K / 256], sc, m uint8 [out, K / 32]) of a Q4_K matrix, whose
    kernel_operands scales are d sc and mins -dmin m."""
    n, k = blocks.shape
    b = blocks.raw.reshape(n, k // 256, 144)
    sc, mn = _k_scales(b[..., 4:16])
    return (_f16(b[..., 0:2]), _f16(b[..., 2:4]), sc.astype(np.uint8).reshape(n, k // 32),
            mn.astype(np.uint8).reshape(n, k // 32))


def q6_factors(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(d float32 [out, K / 256], sc int8 [out, K / 16]) of a Q6_K matrix, whose
    sixteen_operands scales are d sc."""
    n, k = blocks.shape
    b = blocks.raw.reshape(n, k // 256, 210)
    return (_f16(b[..., 208:210]),
            np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(n, k // 16))


def sixteen_operands(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [out, K] in -32..31, scales float32 [out, K / 16]) of a Q6_K matrix: the
    weights are codes * scales exactly, as `gguf.quants.dequantize` gives them."""
    n, k = blocks.shape
    b = blocks.raw.reshape(n, k // 256, 210)
    low = b[..., :128].reshape(n, k // 256, 2, 1, 64) >> np.array([0, 4], np.uint8)[:, None]
    low = (low & 0x0F).reshape(n, k // 256, 2, 4, 32)        # [half, quarter, 32]
    high = b[..., 128:192].reshape(n, k // 256, 2, 1, 32) >> np.array([0, 2, 4, 6],
                                                                         np.uint8)[:, None]
    codes = (low | ((high & 0x03) << 4)).astype(np.int8) - np.int8(32)
    scales = (_f16(b[..., 208:210])[..., None]
              * np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32))
    return codes.reshape(n, k), scales.reshape(n, k // 16)


def _halves(q8: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Signed 8-bit codes q8 [out, K] with scales d [out, K / 32] as two 4-bit halves:
    q8 * d = ((q8 >> 4) + 8) * 16d - 128d + (q8 & 15) * d."""
    return (np.concatenate([(q8 >> 4) + 8, q8 & 15], 1), np.concatenate([16 * d, d], 1),
            np.concatenate([-128 * d, np.zeros_like(d)], 1), True)


def quantize_dense(weight: torch.Tensor, kind: str
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Group-wise weight-only quantization of a dense [out, in] matrix into kernel operands:
    'q4' asymmetric (min to max in 15 steps, Q4_1's form), 'q8' symmetric (Q8_0's form)."""
    w = weight.float().reshape(weight.shape[0], -1, GROUP).numpy()
    if kind == "q4":
        lo, hi = w.min(-1), w.max(-1)
        d = ((hi - lo) / 15).astype(np.float32)
        q = np.clip(np.rint((w - lo[..., None]) / np.where(d > 0, d, 1)[..., None]), 0, 15)
        return q.astype(np.int32).reshape(weight.shape), d, lo.astype(np.float32), False
    d = (np.abs(w).max(-1) / 127).astype(np.float32)
    q8 = np.clip(np.rint(w / np.where(d > 0, d, 1)[..., None]), -127, 127).astype(np.int32)
    return _halves(q8.reshape(weight.shape), d)


def concat_rows(parts: list[Blocks]) -> Blocks | None:
    """Fused projections (q|k|v, gate|up) as one matrix when their blocks share a format."""
    if len({p.qtype for p in parts}) != 1 or len({p.shape[1] for p in parts}) != 1:
        return None
    return Blocks(parts[0].qtype, np.concatenate([p.raw for p in parts]),
                  (sum(p.shape[0] for p in parts), parts[0].shape[1]))


def unpermute_rows(blocks: Blocks, heads: int) -> Blocks:
    """llama.cpp's q/k row order back to Hugging Face's (rows hold whole blocks, so quantized
    rows move as they are)."""
    raw = blocks.raw
    raw = raw.reshape(heads, raw.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(raw.shape)
    return Blocks(blocks.qtype, np.ascontiguousarray(raw), blocks.shape)
