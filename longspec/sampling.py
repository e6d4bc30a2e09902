"""Sampling: one logits-processing function and position-keyed Gumbel-max selection.

Processing order, used by plain decoding, by drafters and by verification alike:
contextual penalty -> temperature -> top-k -> top-p -> min-p -> eta.

The sample for absolute position t is argmax(processed logits + g_t), where the Gumbel noise
g_t depends on (seed, t) only. Plain decoding and tree verification therefore pick the same
token at every position, which makes "lossless" checkable token by token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0    # 0 means greedy
    top_p: float = 1.0          # nucleus mass kept, in (0, 1]
    top_k: int = 0              # keep the k most likely tokens; 0 = off
    min_p: float = 0.0          # drop tokens below min_p * p(most likely); in [0, 1)
    eta: float = 0.0            # eta sampling threshold (Hewitt et al.); 0 = off
    penalty: float = 1.0        # contextual penalty theta on tokens in the window; 1 = off
    penalty_window: int = 1024  # tokens the contextual penalty looks back over

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalty(self) -> bool:
        return self.penalty != 1.0

    def validate(self) -> SamplingConfig:
        """Raise ValueError naming the first setting out of range; return self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
                raise ValueError(f"sampling {f.name} must be a finite number, got {value!r}")
        checks = [
            ("temperature", self.temperature >= 0, ">= 0 (0 is greedy)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0 and float(self.top_k).is_integer(), "a whole number >= 0"),
            ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
            ("eta", 0 <= self.eta < 1, "in [0, 1)"),
            ("penalty", self.penalty > 0, "> 0 (1 is off)"),
            ("penalty_window", self.penalty_window >= 1 and float(self.penalty_window).is_integer(),
             "a whole number >= 1"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"sampling {name} must be {rule}, got {getattr(self, name)!r}")
        return self


def apply_penalty(logits: torch.Tensor, present: torch.Tensor, theta: float) -> torch.Tensor:
    """Contextual (repetition) penalty: logits of tokens present in the window are divided by
    theta when positive and multiplied by it when negative."""
    penalized = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(present, penalized, logits)


def process_logits(logits: torch.Tensor, cfg: SamplingConfig,
                   present: torch.Tensor | None = None) -> torch.Tensor:
    """The one logits-processing function. logits [n, vocab] -> processed fp32 logits, with
    removed tokens at -inf. `present` [n, vocab] marks tokens in each row's penalty window."""
    x = logits.float()
    if present is not None and cfg.uses_penalty:
        x = apply_penalty(x, present, cfg.penalty)
    if cfg.greedy:
        return x
    if cfg.temperature != 1.0:
        x = x / cfg.temperature
    neg_inf = float("-inf")
    if 0 < cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, int(cfg.top_k), dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, neg_inf)
    if cfg.top_p < 1.0:
        x = x.masked_fill(_outside_nucleus(x, cfg.top_p), neg_inf)
    if cfg.min_p > 0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < cfg.min_p * probs.amax(dim=-1, keepdim=True), neg_inf)
    if cfg.eta > 0:
        probs = torch.softmax(x, dim=-1)
        entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1, keepdim=True)
        threshold = torch.minimum(torch.full_like(entropy, cfg.eta),
                                  math.sqrt(cfg.eta) * torch.exp(-entropy))
        remove = probs < threshold
        remove.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)
        x = x.masked_fill(remove, neg_inf)
    return x


# On a CPU, torch's full sort of the vocabulary costs ~0.6 ms a row; the nucleus usually lies
# within the top few dozen tokens, which topk finds ~10x faster; numpy sorts values ~5x faster.
NUCLEUS_CANDIDATES = 64


def _outside_nucleus(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool mask of the tokens outside the nucleus: the most likely tokens whose mass before
    them is below top_p (at an exact tie on the boundary, every tied token stays)."""
    probs = torch.softmax(x, dim=-1)
    k = min(NUCLEUS_CANDIDATES, x.shape[-1])
    top, order = torch.topk(probs, k, dim=-1)
    mass_before = torch.cumsum(top, dim=-1) - top
    # the shortcut needs a host check, which costs nothing on a CPU and a sync on a GPU
    if k == x.shape[-1] or (x.device.type == "cpu"
                            and bool((mass_before[:, -1] + top[:, -1] >= top_p).all())):
        outside = torch.ones_like(x, dtype=torch.bool)
        return outside.scatter_(-1, order, mass_before >= top_p)
    if x.device.type == "cpu":
        ordered = torch.from_numpy(np.ascontiguousarray(np.sort(probs.numpy(), axis=-1)[:, ::-1]))
    else:
        ordered = torch.sort(probs, dim=-1, descending=True).values
    last_kept = ((torch.cumsum(ordered, dim=-1) - ordered) < top_p).sum(-1, keepdim=True) - 1
    return probs < ordered.gather(-1, last_kept)


def position_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed mixing (seed, position) with splitmix64."""
    z = ((seed & _MASK64) * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class PositionNoise:
    """Gumbel noise g_t [vocab] for absolute position t, a function of (seed, t) alone.

    Each position's noise is drawn once and kept until `forget_before` passes it.
    """

    def __init__(self, seed: int, vocab_size: int, device: torch.device):
        self.seed = seed
        self.vocab_size = vocab_size
        self.device = device
        self._noise: dict[int, torch.Tensor] = {}

    def _draw(self, position: int) -> torch.Tensor:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(position_seed(self.seed, position))
        u = torch.rand(self.vocab_size, generator=gen, device=self.device)
        return -torch.log(-torch.log(u.clamp_min(1e-20)))

    def rows(self, first: int, count: int) -> torch.Tensor:
        """Noise for positions first .. first + count - 1, stacked [count, vocab]."""
        out = []
        for t in range(first, first + count):
            if t not in self._noise:
                self._noise[t] = self._draw(t)
            out.append(self._noise[t])
        return torch.stack(out)

    def forget_before(self, position: int) -> None:
        for t in [t for t in self._noise if t < position]:
            del self._noise[t]


def select_tokens(processed: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """The token each row chooses: argmax of processed logits, plus Gumbel noise when sampling."""
    return (processed if noise is None else processed + noise).argmax(dim=-1)
