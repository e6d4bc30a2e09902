"""Position-keyed Gumbel noise from a counter-based hash.

The sample at absolute position t is argmax(processed logits + g_t), with

    g_t[v] = -log(-log(u)),   u = (h + 1/2) / 2^32,   h = H(key, t, v)

where H is a 32-bit integer hash and key mixes the seed with a hash of the prompt's token ids.
So the noise depends on (seed, prompt, position) alone: plain decoding, tree verification and
draft models that sample all see the same g_t (which makes speculation checkable token by
token), and two different prompts with the same seed draw independent samples. H is integer
arithmetic on int64 tensors whose products stay below 2^63, so it gives the same bits on every
device; the logarithms run in float64 and round to float32, so the noise is the same on CPU and
CUDA except where two float64 results straddle a float32 rounding boundary.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..device.memory import upload

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_MULT = 0x045D9F3B          # odd, below 2^31: products of 32-bit values fit in int64


def _mix32(x):
    """A bijective 32-bit integer hash of a Python int or an int64 tensor holding values in
    [0, 2^32); a tensor is hashed in place (a fresh one per operation costs as much again)."""
    for _ in range(2):
        x ^= x >> 16
        x *= _MULT
        x &= _MASK32
    x ^= x >> 16
    return x


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def prompt_hash(prompt_ids: list[int]) -> int:
    """A 64-bit hash of the prompt's token ids."""
    data = b"".join(int(t).to_bytes(8, "little", signed=True) for t in prompt_ids)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def noise_key(seed: int, prompt_ids: list[int]) -> int:
    """The 64-bit key of a generation's noise: (seed, prompt) mixed."""
    return splitmix64((seed & _MASK64) ^ splitmix64(prompt_hash(prompt_ids)))


def _position_hash(key, position):
    """The per-position part of H: (p, q) for a position (a Python int, or an int64 tensor).
    `key`: the 64-bit key, or its low and high 32 bits as int64 tensors (a key per row)."""
    lo, hi = key if isinstance(key, tuple) else (key & _MASK32, key >> 32)
    p = _mix32(_mix32((position & _MASK32) ^ lo) ^ hi)
    return p, _mix32(p ^ 0x5BD1E995)


# Up to this many positions, their hashes are computed as Python ints (tensors of a few entries
# cost ~5 us an operation, 27 of them)
FEW_POSITIONS = 64
# Up to this many entries on a CPU, H's integer part runs on numpy arrays, ~1 us an operation
# (the same integers; the logarithms stay torch's): the noise of 3 entries of a sampled row's
# nucleus took 49 us, 30 us so (their position's hashes made into arrays by numpy too)
FEW_ENTRIES = 4096


def _position_parts(key: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) of `_position_hash` for each of the int64 `positions`, shaped as they are."""
    if 0 < positions.numel() <= FEW_POSITIONS and positions.device.type == "cpu":
        pairs = [_position_hash(key, t) for t in positions.reshape(-1).tolist()]
        return tuple(torch.from_numpy(np.array(part, dtype=np.int64)).reshape(positions.shape)
                     for part in zip(*pairs))
    return _position_hash(key, positions)


def _gumbel(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """g[v] (float32) from positions' (p, q) and token ids v, broadcast against each other."""
    tokens = tokens.to(torch.int64)
    entries = (tokens.numel() if p.shape == tokens.shape     # at most, where they broadcast
               else p.numel() * tokens.numel())
    if tokens.device.type == "cpu" and entries <= FEW_ENTRIES:
        h = tokens.numpy() ^ p.numpy()
        h = _mix32(h) + q.numpy()
        h &= _MASK32
        h = torch.from_numpy(_mix32(h))
    else:
        h = tokens ^ p
        h = _mix32(_mix32(h).add_(q).bitwise_and_(_MASK32))
    u = h.double().add_(0.5).mul_(2.0**-32)
    return u.log_().neg_().log_().neg_().float()


def gumbel_at(key: int, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """g_t[v] (float32) for absolute positions t and token ids v broadcast against each other:
    an entry's value does not depend on which others are computed with it."""
    p, q = _position_parts(key, positions.to(torch.int64))
    return _gumbel(p, q, tokens)


def gumbel_rows(key: int, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [len(positions), vocab] (float32) for absolute `positions`, on their device."""
    v = torch.arange(vocab_size, dtype=torch.int64, device=positions.device)
    return gumbel_at(key, positions[:, None], v)


def gumbel_keyed(keys: list[int], positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [len(keys), vocab] (float32) of several generations at once: row i is
    gumbel_rows(keys[i], positions[i:i + 1], vocab_size)'s, bit for bit (the same integer
    arithmetic, each row's key halves as tensors)."""
    device = positions.device
    halves = (upload([k & _MASK32 for k in keys], device)[:, None],
              upload([k >> 32 for k in keys], device)[:, None])
    p, q = _position_hash(halves, positions.to(torch.int64)[:, None])
    return _gumbel(p, q, torch.arange(vocab_size, dtype=torch.int64, device=device))


# Below this fraction of finite scores, noise is computed for those entries alone: for a nucleus
# of a few dozen tokens out of 49K, 0.19 ms instead of 0.51 ms a row on a CPU, the same bits.
SPARSE_FRACTION = 1 / 8


class PositionNoise:
    """The noise of one generation. On a CPU whole rows are computed once and kept until
    committed past, and scores that are mostly -inf get noise only at their finite entries; on
    a GPU (`keeps_rows` False) each row's noise is computed where it is added, from the
    positions on the device, which keeps the host out of the step (the same bits)."""

    def __init__(self, seed: int, prompt_ids: list[int], vocab_size: int, device: torch.device):
        self.key = noise_key(seed, prompt_ids)
        self.vocab_size = vocab_size
        self.device = device
        self.keeps_rows = device.type == "cpu"
        self._rows: dict[int, torch.Tensor] = {}

    def rows(self, first: int, count: int) -> torch.Tensor:
        """Noise for positions first .. first + count - 1, stacked [count, vocab]."""
        missing = [t for t in range(first, first + count) if t not in self._rows]
        if missing:
            fresh = gumbel_rows(self.key, torch.tensor(missing, device=self.device),
                                self.vocab_size)
            self._rows.update(zip(missing, fresh))
        return torch.stack([self._rows[t] for t in range(first, first + count)])

    def add(self, scores: torch.Tensor, positions: torch.Tensor,
            columns: torch.Tensor | None = None) -> torch.Tensor:
        """scores [m, vocab] plus the noise of each row's absolute position [m]. A -inf score
        stays -inf, so where few are finite (top-p, top-k) only those entries get noise. With
        `columns` (token ids [c]) the scores [m, c] are of those tokens."""
        if not self.keeps_rows:
            tokens = (torch.arange(self.vocab_size, device=scores.device) if columns is None
                      else columns)
            return scores + gumbel_at(self.key, positions[:, None], tokens)
        if columns is not None:
            return scores + self._dense(positions)[:, columns]
        sparse = self._sparse(scores, positions)
        if sparse is None:
            return scores + self._dense(positions)
        rows, tokens, values = sparse
        noisy = scores.clone()
        noisy[rows, tokens] = values
        return noisy

    def argmax(self, scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The index of each row's largest score plus noise [m] (`add` then torch's argmax,
        the first of equal ones): where few scores are finite, among those alone."""
        sparse = self._sparse(scores, positions) if self.keeps_rows else None
        if sparse is None:
            return self.add(scores, positions).argmax(dim=-1)
        rows, tokens, values = sparse
        m = scores.shape[0]
        best = torch.full((m,), float("-inf")).scatter_reduce_(0, rows, values, "amax")
        top = values == best[rows]
        return torch.full((m,), scores.shape[1]).scatter_reduce_(0, rows[top], tokens[top],
                                                                 "amin")

    def _sparse(self, scores: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Where few of the scores [m, vocab] are finite (SPARSE_FRACTION): their rows, their
        tokens (in order) and their values plus noise; else None."""
        finite = scores != float("-inf")       # counted first: a fifth of the cost of listing
        if int(finite.sum()) >= SPARSE_FRACTION * scores.numel():
            return None
        rows, tokens = finite.nonzero(as_tuple=True)
        p, q = _position_parts(self.key, positions.to(torch.int64))
        return rows, tokens, scores[rows, tokens] + _gumbel(p[rows], q[rows], tokens)

    def _dense(self, positions: torch.Tensor) -> torch.Tensor:
        """Whole noise rows [m, vocab] of the positions [m]."""
        first = int(positions.min())
        return self.rows(first, int(positions.max()) - first + 1)[positions - first]

    def forget_before(self, position: int) -> None:
        for t in [t for t in self._rows if t < position]:
            del self._rows[t]
