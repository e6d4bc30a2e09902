"""Rotary position embeddings: inverse frequencies for each supported scaling, and their use.

A position's rotation depends on the model and the position alone, never on how long the run
will be, so the first tokens of an answer are the same whatever `max_new_tokens` is. Dynamic
NTK scaling stretches the base for sequences past the trained length: position p is rotated as
transformers rotates a token it decodes at p (the base for a sequence of p + 1 positions). It
differs from transformers only for prompts longer than the trained length, which transformers
rotates all at once with the base of the whole prompt.
"""

from __future__ import annotations

import math

import torch

from .config import RopeConfig


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    original = rope.original_max_positions
    low_wavelen = original / rope.low_freq_factor
    high_wavelen = original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = ((original / wavelen - rope.low_freq_factor)
              / (rope.high_freq_factor - rope.low_freq_factor))
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    if rope.attention_factor is not None:
        attention = float(rope.attention_factor)
    elif rope.mscale and rope.mscale_all_dim:
        attention = (_yarn_mscale(rope.factor, rope.mscale)
                     / _yarn_mscale(rope.factor, rope.mscale_all_dim))
    else:
        attention = _yarn_mscale(rope.factor)

    def correction_dim(rotations: float) -> float:
        ratio = rope.original_max_positions / (rotations * 2 * math.pi)
        return dim * math.log(ratio) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = _base_inv_freq(rope.theta, dim)
    interpolation = extrapolation / rope.factor
    keep = 1 - ramp  # share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep, attention


def rope_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] (fp32) and the scale applied to cos/sin; for dynamic
    scaling those of the trained length (`dynamic_frequencies` gives the later positions')."""
    inv_freq, scale = _scaled_inv_freq(rope, head_dim)
    if rope.freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32)
    return inv_freq, scale


def dynamic_frequencies(rope: RopeConfig, head_dim: int, max_positions: int,
                        inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Inverse frequencies of each position [q, head_dim // 2] under dynamic NTK scaling: the
    base grown for a sequence of p + 1 positions where that passes `max_positions`."""
    length = positions.double()[:, None] + 1
    growth = (rope.factor * length / max_positions - (rope.factor - 1)).clamp(min=1)
    theta = rope.theta * growth ** (head_dim / (head_dim - 2))
    exponent = torch.arange(0, head_dim, 2, device=positions.device).double() / head_dim
    grown = (1.0 / theta ** exponent).float()
    return torch.where(length > max_positions, grown, inv_freq.to(positions.device))


def _scaled_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    if rope.type in ("default", "dynamic"):
        return _base_inv_freq(rope.theta, head_dim), 1.0
    if rope.type == "linear":
        return _base_inv_freq(rope.theta, head_dim) / rope.factor, 1.0
    if rope.type == "llama3":
        return _llama3(_base_inv_freq(rope.theta, head_dim), rope), 1.0
    if rope.type == "yarn":
        return _yarn(rope, head_dim)
    raise ValueError(f"unsupported RoPE type {rope.type!r}")


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [q, 1, head_dim] for integer positions [q], computed in fp32;
    `inv_freq` is [head_dim // 2], or [q, head_dim // 2] for one set per position.

    Llama checkpoints rotate halves: x' = x * cos + (-x2, x1) * sin. The sign of the first half
    of sin is folded in here, so that `apply_rope` needs a roll and no negation.
    """
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin() * scale
    sin[:, :freqs.shape[1]].neg_()
    return (emb.cos() * scale).to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [q, heads, head_dim] by position (halves layout, as Llama checkpoints use)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
