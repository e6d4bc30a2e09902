"""EAGLE's feature drafter (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty"): one decoder layer that predicts the target's next hidden state.

Glossary:
- feature f_t: the target's final hidden state at position t, before its final norm (what
  `ForwardOutput.hidden` holds); the target's logits there are LM head(norm(f_t)).
- pair (f_{t-1}, x_t): the drafter's input at position t, fc([embed(x_t); f_{t-1}]) (the token
  shifts the feature by one, which removes the sampling's uncertainty from the prediction).
- predicted feature f^_t: the drafter's output for that pair, a guess of f_t; the draft's
  logits are the target's LM head(final norm(f^_t)), a guess of the token at t + 1.

The embedding, final norm and LM head are the target's own, frozen; the drafter owns fc and
one Llama decoder layer (RMSNorm, rotary attention with the target's head layout, SwiGLU
MLP) sized from the target's config. Drafting runs it over its own small KV cache
(`FeatureCache`), one slot per pair: the committed sequence's pairs with the target's true
features, then the draft tree's with predicted ones.

- draft vocabulary: the drafter may guess among the training text's most frequent tokens only
  (`draft_vocab`, token ids): its logits are then the LM head's rows of those tokens, a product
  a fraction of the full head's size (EAGLE-3 and FR-Spec do the same). The target still
  verifies over its whole vocabulary; a token outside the draft vocabulary is never drafted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models.rope import apply_rope, rope_cos_sin, rope_frequencies
from . import store

FORMAT = 1
INIT_STD = 0.02


@dataclass(frozen=True)
class EagleShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float

    @classmethod
    def of(cls, config) -> EagleShape:
        """The target's own layer shape (a ModelConfig)."""
        return cls(config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                   config.intermediate_size, config.rms_norm_eps)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Attention with each key/value head shared by its group of query heads, no key copies.

    q [..., T, heads, head_dim]; k, v [..., kv_heads, S, head_dim]; mask additive [T, S].
    Returns [..., T, heads * head_dim]."""
    *lead, t, heads, dim = q.shape
    kv_heads, s = k.shape[-3], k.shape[-2]
    group = heads // kv_heads
    qg = q.transpose(-3, -2).reshape(*lead, kv_heads, group * t, dim)
    scores = (qg @ k.transpose(-1, -2)).view(*lead, kv_heads, group, t, s) * dim ** -0.5
    probs = torch.softmax((scores + mask).float(), dim=-1).to(q.dtype)
    out = probs.view(*lead, kv_heads, group * t, s) @ v          # [..., kv_heads, g*T, dim]
    return out.view(*lead, heads, t, dim).transpose(-3, -2).reshape(*lead, t, heads * dim)


class FeatureCache:
    """The drafter's keys and values [kv_heads, capacity, head_dim], one slot per pair."""

    def __init__(self, shape: EagleShape, capacity: int, dtype: torch.dtype, device):
        size = (shape.num_kv_heads, capacity, shape.head_dim)
        self.k = torch.zeros(size, dtype=dtype, device=device)
        self.v = torch.zeros(size, dtype=dtype, device=device)
        self.capacity = capacity

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [kv_heads, q, head_dim] at slots start..; return slots [0, start + q)."""
        end = start + k.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"feature cache overflow: {end} slots of {self.capacity}")
        self.k[:, start:end] = k
        self.v[:, start:end] = v
        return self.k[:, :end], self.v[:, :end]


class EagleDrafterNet(nn.Module):
    def __init__(self, shape: EagleShape, inv_freq: torch.Tensor, rope_scale: float = 1.0,
                 draft_vocab: int = 0):
        """`inv_freq` [head_dim // 2], `rope_scale`: the target's rotary frequencies;
        `draft_vocab`: the size of the draft vocabulary (0: the target's whole vocabulary)."""
        super().__init__()
        h, s = shape.hidden_size, shape
        self.shape = shape
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.wqkv = nn.Linear(h, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.wo = nn.Linear(s.num_heads * s.head_dim, h, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.w_gate_up = nn.Linear(h, 2 * s.intermediate_size, bias=False)
        self.w_down = nn.Linear(s.intermediate_size, h, bias=False)
        self.inv_freq = inv_freq.float()    # kept in float32, not a buffer: .to(dtype) skips it
        self.rope_scale = rope_scale
        # token ids [draft_vocab] the drafter guesses among (an integer buffer: saved with the
        # weights, never cast to the float dtype)
        self.register_buffer("vocab", torch.arange(draft_vocab) if draft_vocab else None)
        for lin in (self.fc, self.wqkv, self.wo, self.w_gate_up, self.w_down):
            nn.init.normal_(lin.weight, std=INIT_STD)
        with torch.no_grad():       # start by passing the feature through: fc = [small | I]
            self.fc.weight[:, h:].copy_(torch.eye(h))
            self.fc.bias.zero_()

    @classmethod
    def for_model(cls, model, draft_vocab: int = 0) -> EagleDrafterNet:
        c = model.config
        inv_freq, scale = rope_frequencies(c.rope, c.head_dim)
        return cls(EagleShape.of(c), inv_freq, scale, draft_vocab)

    def set_vocab(self, token_ids: torch.Tensor) -> None:
        """Guess among these token ids [draft_vocab] only."""
        self.vocab = token_ids.to(device=self.fc.weight.device, dtype=torch.long)

    def head(self, net) -> torch.Tensor:
        """The LM head's rows the drafter's logits use [draft vocabulary, hidden] (dense)."""
        head = net.dense_head()
        return head if self.vocab is None else head[self.vocab]

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: FeatureCache | None = None, start: int = 0,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted features [..., T, hidden] for pairs (features [..., T, hidden], token
        embeddings [..., T, hidden]) at `positions` [T].

        Without a cache the T pairs attend causally among themselves (training, [B, T, ...]);
        with one (drafting, no batch dimension) their keys go to slots start.. and they attend
        to slots [0, start + T) through the additive `mask` [T, start + T]."""
        s = self.shape
        t = embeds.shape[-2]
        x = self.fc(torch.cat([embeds, features], dim=-1))
        h = F.rms_norm(x, (s.hidden_size,), self.attn_norm, s.eps)
        qkv = self.wqkv(h)
        nq, nkv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        cos, sin = rope_cos_sin(positions, self.inv_freq.to(x.device), self.rope_scale, x.dtype)
        lead = qkv.shape[:-1]
        q = apply_rope(qkv[..., :nq].reshape(*lead, s.num_heads, s.head_dim), cos, sin)
        k = apply_rope(qkv[..., nq:nq + nkv].reshape(*lead, s.num_kv_heads, s.head_dim), cos, sin)
        v = qkv[..., nq + nkv:].reshape(*lead, s.num_kv_heads, s.head_dim)
        k, v = k.transpose(-3, -2), v.transpose(-3, -2)           # [..., kv_heads, T, dim]
        if cache is not None:
            k, v = cache.write(start, k, v)
        if mask is None:
            mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        x = x + self.wo(grouped_attention(q, k, v, mask))
        h = F.rms_norm(x, (s.hidden_size,), self.mlp_norm, s.eps)
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)

    def save(self, out_dir: str | Path, model, extra: dict | None = None) -> None:
        store.save(out_dir, "eagle", self, model,
                   {"format": FORMAT, **asdict(self.shape), **(extra or {})})


def load_eagle(path: str | Path, model) -> EagleDrafterNet:
    """The drafter in `path`, checked against `model`, on its device and dtype."""
    meta, state = store.read(path, "eagle", model)
    try:
        shape = EagleShape(**{k: type(v)(meta[k]) for k, v in
                              asdict(EagleShape.of(model.config)).items()})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}/eagle.json is not a valid eagle config: {e}") from None
    vocab = state.get("vocab")
    if vocab is not None and (vocab.dim() != 1 or vocab.is_floating_point()
                              or not ((vocab >= 0) & (vocab < model.config.vocab_size)).all()):
        raise ValueError(f"{path}: the draft vocabulary is not token ids of this model")
    size = 0 if vocab is None else len(vocab)
    net = EagleDrafterNet.for_model(model, size)
    if shape != net.shape:
        net = EagleDrafterNet(shape, net.inv_freq, net.rope_scale, size)
    return store.load_into(net, state, path, "eagle", model)
